# Copyright (c) gpuops.repurpose contributors
# GNU General Public License v3.0+ (see LICENSES/GPL-3.0-or-later.txt or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Variables of ``ansible.builtin.ssh`` that the ``pct_ssh`` connection does not use.

This is a PRIVATE plugin_utils of gpuops.repurpose; its API may change at any
time. An inventory written for ssh (``ansible_ssh_pipelining=false``,
``ansible_ssh_common_args=...``) would otherwise be silently ignored by
pct_ssh. Ansible hands a connection plugin only the variables its options
declare, so pct_ssh declares these names (option ``ssh_only_vars``) just to
see them, and warns once per name with what to set instead.

Keep ``SSH_ONLY_VARS`` equal to the variables of ansible.builtin.ssh that
pct_ssh does not consume (a unit test compares the two plugins' docs).
"""

from __future__ import annotations

import typing as t

_TRANSFER = "set ansible_pct_ssh_transfer_method (auto, sftp or cat) instead"
_NO_SSH_COMMAND = (
    "pct_ssh logs in with paramiko, not the ssh command, so ssh options do not apply; "
    "for a jump host set ansible_paramiko_proxy_command"
)

# name -> what to do instead (one sentence, no trailing full stop)
SSH_ONLY_VARS: t.Dict[str, str] = {
    "ansible_control_path": "the socket is named by pct_ssh; set ansible_pct_ssh_control_path_dir for its directory",
    "ansible_control_path_dir": "set ansible_pct_ssh_control_path_dir instead",
    "ansible_private_key": "write the key to a file (mode 0600) and set ansible_ssh_private_key_file",
    "ansible_ssh_private_key": "write the key to a file (mode 0600) and set ansible_ssh_private_key_file",
    "ansible_private_key_passphrase": "set ansible_password instead (pct_ssh uses it as the key's passphrase)",
    "ansible_ssh_private_key_passphrase": "set ansible_password instead (pct_ssh uses it as the key's passphrase)",
    "ansible_scp_executable": _TRANSFER,
    "ansible_scp_extra_args": _TRANSFER,
    "ansible_sftp_batch_mode": _TRANSFER,
    "ansible_sftp_executable": _TRANSFER,
    "ansible_sftp_extra_args": _TRANSFER,
    "ansible_ssh_transfer_method": _TRANSFER,
    "ansible_ssh_args": _NO_SSH_COMMAND,
    "ansible_ssh_common_args": _NO_SSH_COMMAND,
    "ansible_ssh_extra_args": _NO_SSH_COMMAND,
    "ansible_ssh_executable": _NO_SSH_COMMAND,
    "ansible_ssh_pkcs11_provider": "pct_ssh has no PKCS#11 support; use a key file or an ssh-agent holding the key",
    "ansible_ssh_password_mechanism": "paramiko logs in with ansible_password itself (no sshpass)",
    "ansible_sshpass_prompt": "paramiko logs in with ansible_password itself (no sshpass)",
    "ansible_ssh_pipelining": "set ansible_pct_ssh_pipelining (or ansible_pipelining) instead",
    "ansible_ssh_retries": "pct_ssh reopens a dropped connection once by itself; there is no retry count",
    "ansible_ssh_use_tty": "set ansible_pct_ssh_pty instead",
    "ansible_ssh_verbosity": "run ansible with -vvv to see pct_ssh's commands",
}


def ignored_var_warnings(var_names: t.Iterable[str]) -> t.List[str]:
    """One warning per ssh-only name in VAR_NAMES, sorted, without host names.

    Ansible shows an identical warning only once per run, so leaving the host
    out is what makes "once per name" hold across hosts and tasks.
    """
    return [
        "pct_ssh ignores %s, a variable of ansible.builtin.ssh: %s." % (name, SSH_ONLY_VARS[name])
        for name in sorted(set(var_names) & set(SSH_ONLY_VARS))
    ]
