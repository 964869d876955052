"""The fleet_notes callback: its messages, and real ansible-playbook runs that are interrupted or find a host
unreachable (the checkout's ansible.cfg enables it; loopback only)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import pytest

from ansible_collections.gpuops.repurpose.plugins.callback.fleet_notes import interrupted_message, unreachable_lines
from tests.support.playbook import ansible_env, playbook_argv
from tests.support.stop_training import REPURPOSE_PLAYBOOK
from tests.support.wait import wait_for

pytestmark = pytest.mark.processes


def test_the_messages():
    assert interrupted_message("SIGINT", []).startswith("SIGINT: interrupted before any stop ladder started")
    said = interrupted_message("SIGTERM", ["ct200", "ct201"])
    assert said.startswith("SIGTERM: interrupted. The stop ladder had started on ct200, ct201: it goes on in the "
                           "container by itself")
    assert "Run the same command again: it reports what that ladder stopped" in said
    assert unreachable_lines({"ct200": "boom"}, summary_printed=True) == []
    assert unreachable_lines({"ct201": "no route", "ct200": "refused"}, summary_printed=False) == [
        "FLEET (from the run's record: no play was left to print the summary): 2 host(s) unreachable",
        "  ct200: unreachable, nothing was done there: refused",
        "  ct201: unreachable, nothing was done there: no route",
        "  re-run them, once reachable: --limit ct200,ct201"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again when this returns: nothing listens there


def test_an_unreachable_container_still_gets_its_fleet_line(tmp_path):
    """The repurpose playbook on one container whose SSH port is closed: every host of the first play is
    unreachable, ansible-core runs no later play and no summary task; the callback prints the fleet line."""
    inventory = tmp_path / "hosts.ini"
    inventory.write_text("[training_containers]\nct200 ansible_connection=ssh ansible_host=127.0.0.1 "
                         f"ansible_port={closed_port()} ansible_user=root proxmox_vmid=200 "
                         "stop_training_pve_host=ct200\n")
    done = subprocess.run(playbook_argv(REPURPOSE_PLAYBOOK, inventory, [{"repurpose_datagen": False}]),
                          capture_output=True, text=True, timeout=300, env=ansible_env(), check=False)
    assert done.returncode != 0
    assert "UNREACHABLE!" in done.stdout, done.stdout[-3000:]
    err = done.stderr
    assert "FLEET (from the run's record: no play was left to print the summary): 1 host(s) unreachable" in err, \
        err[-3000:]
    assert "  ct200: unreachable, nothing was done there: " in err
    assert "re-run them, once reachable: --limit ct200" in err
    assert "FLEET (from the run's record" not in done.stdout  # stdout is the stdout callback's alone


def test_ctrl_c_during_a_ladder_says_it_goes_on_and_a_rerun_reports_it(tmp_path):
    """A real training_stop on localhost against a process that ignores SIGTERM (its first rung waits 30 s): Ctrl-C
    to ansible-playbook meanwhile prints the note before it exits."""
    termed = tmp_path / "termed"
    job = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\n"
                            "signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'w').close())\n"
                            "while True: time.sleep(0.2)", str(termed)])
    playbook = tmp_path / "stop.yml"
    playbook.write_text(
        "- hosts: localhost\n  gather_facts: false\n  tasks:\n"
        "    - gpuops.repurpose.training_stop:\n"
        f"        pids: [{job.pid}]\n"
        f"        lock_dir: {tmp_path / 'locks'}\n"
        "        gpu_devices: []\n"
        "        ladder: [{signal: SIGTERM, timeout: 30}, {signal: SIGKILL, timeout: 5}]\n")
    argv = playbook_argv(playbook, "localhost,", [{"ansible_python_interpreter": sys.executable}])
    proc = subprocess.Popen(argv + ["-c", "local"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=ansible_env(), start_new_session=True)
    try:
        # the ladder has sent its SIGTERM (noted, not obeyed) and waits its rung out
        wait_for(termed.exists, 60, "the ladder's first signal")
        time.sleep(1)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
        job.kill()
        job.wait()
    assert "SIGINT: interrupted. The stop ladder had started on localhost: it goes on in the container by itself" \
        in out, out[-3000:]
