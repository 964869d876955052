#!/bin/sh
# Copyright (c) gpuops.repurpose contributors
# SPDX-License-Identifier: GPL-3.0-or-later
#
# Controller side (run by the role through the pipe lookup): print the PID of the
# ansible-playbook process that runs this play. The lookup runs in a forked
# worker whose command line is the same as its parent's, so climb from this
# shell to the first ansible-playbook ancestor, then on while the parent is
# still ansible-playbook: the top of that chain is the main process. The role
# records it in the target's lock so a later run on this controller can prove
# that a lock's holder was killed (a partial run) and take the lock over.
p=$$
top=
steps=0
while [ "$p" -gt 1 ] && [ "$steps" -lt 64 ]; do
  if tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q 'ansible-playbook'; then
    top=$p
  elif [ -n "$top" ]; then
    break
  fi
  p=$(sed -e 's/^.*) //' "/proc/$p/stat" 2>/dev/null | cut -d' ' -f2)
  [ -n "$p" ] || break
  steps=$((steps + 1))
done
echo "${top:-0}"
