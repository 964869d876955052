"""pct_ssh with a non-root PVE login (the lab's ``pveops``): ``~`` is the container user's home.

Ansible expands ``~`` (remote_tmp, async_dir, paths in copy/fetch) in the home of
the connection's remote user. Through pct_ssh the commands run as root inside
the container, where the host login ``pveops`` does not exist: ``~pveops`` would
stay literal (temporary files under ``/~pveops/.ansible/tmp``, async results
looked for in ``~pveops/.ansible_async`` while the job wrote ``/root/...``).

One ansible-playbook run, CT200 as ``pveops`` with and without pipelining:
async (fire-and-forget + async_status, and polled), a non-pipelined copy and
template whose remote source lies in ``/root/.ansible/tmp``, fetch of a ``~/``
path, become to another user inside the container, and no ``/~pveops`` left.
"""

from __future__ import annotations

from pathlib import Path

import pytest


def _helpers():
    """The lab helpers of test_pct_ssh.py, loaded under their own name (test modules share one namespace)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("pct_ssh_lab_helpers_nonroot", Path(__file__).with_name("test_pct_ssh.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_h = _helpers()
base_vars = _h.base_vars
lab_status = _h.lab_status
run_playbook = _h.run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.timeout(400)]

HOSTS = {"pveops_pipelined": True, "pveops_plain": False}

PLAY = """
- hosts: all
  gather_facts: false
  vars:
    d: "/tmp/pct_ssh_nonroot-{{ inventory_hostname }}"
  tasks:
    - name: forget an earlier literal ~pveops (raw needs no temporary directory)
      ansible.builtin.raw: rm -rf '/~pveops' "{{ d }}" "/root/pct_ssh_nonroot-{{ inventory_hostname }}"
    - name: mkdir
      ansible.builtin.file:
        path: "{{ d }}"
        state: directory
        mode: "0755"
    - name: async fire and forget
      ansible.builtin.command: sh -c 'sleep 2; echo async-done'
      async: 60
      poll: 0
      register: job
    - name: async_status finds the job
      ansible.builtin.async_status:
        jid: "{{ job.ansible_job_id }}"
      register: job_result
      until: job_result.finished
      retries: 30
      delay: 1
    - name: async polled
      ansible.builtin.command: echo polled
      async: 30
      poll: 1
      register: polled
    - name: copy
      ansible.builtin.copy:
        content: "copied {{ inventory_hostname }}\\n"
        dest: "{{ d }}/copied.txt"
        mode: "0644"
      register: copied
    - name: template
      ansible.builtin.template:
        src: "{{ it_template }}"
        dest: "{{ d }}/templated.txt"
        mode: "0644"
      register: templated
    - name: copy to a ~ path
      ansible.builtin.copy:
        content: "home {{ inventory_hostname }}\\n"
        dest: "~/pct_ssh_nonroot-{{ inventory_hostname }}"
        mode: "0600"
      register: home_copy
    - name: fetch from a ~ path
      ansible.builtin.fetch:
        src: "~/pct_ssh_nonroot-{{ inventory_hostname }}"
        dest: "{{ it_fetch }}/home.txt"
        flat: true
    - name: fetch
      ansible.builtin.fetch:
        src: "{{ d }}/templated.txt"
        dest: "{{ it_fetch }}/templated.txt"
        flat: true
    - name: become nobody inside the container, non-pipelined files readable by it
      ansible.builtin.command: id -un
      become: true
      become_user: nobody
      become_method: ansible.builtin.su
      become_flags: "-s /bin/sh"
      register: nobody
    - name: cleanup
      ansible.builtin.file:
        path: "{{ item }}"
        state: absent
      loop:
        - "{{ d }}"
        - "~/pct_ssh_nonroot-{{ inventory_hostname }}"
    - name: no literal ~pveops anywhere
      ansible.builtin.raw: "if test -e '/~pveops' || test -e '~pveops'; then echo LEFT; else echo clean; fi"
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    status = lab_status()
    tmp = tmp_path_factory.mktemp("pct_ssh_nonroot")
    template = tmp / "t.j2"
    template.write_text("templated {{ inventory_hostname }} for {{ ansible_user }}\n")
    hosts = {
        name: base_vars(
            status,
            ansible_user="pveops",
            ansible_pipelining=pipelining,
            it_template=str(template),
            it_fetch=str(tmp / "fetched" / name),
        )
        for name, pipelining in HOSTS.items()
    }
    return run_playbook(tmp, hosts, PLAY), tmp


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_async_job_is_found_by_async_status(results, host):
    r = results[0]
    job = r["async fire and forget"][host]
    assert job["results_file"].startswith("/root/.ansible_async/"), job
    done = r["async_status finds the job"][host]
    assert not done.get("failed"), done
    assert done["finished"] and done["stdout"] == "async-done"
    polled = r["async polled"][host]
    assert not polled.get("failed"), polled
    assert polled["stdout"] == "polled"


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_copy_and_template_go_through_roots_home(results, host):
    r, tmp = results
    for task in ("copy", "template", "copy to a ~ path"):
        res = r[task][host]
        assert not res.get("failed"), res
        assert res["changed"], res
        # the uploaded source lies in the module's remote temporary directory (pipelined or not)
        assert res["src"].startswith("/root/.ansible/tmp/ansible-tmp-"), (task, res["src"])
    assert r["copy to a ~ path"][host]["dest"] == "/root/pct_ssh_nonroot-%s" % host
    assert (tmp / "fetched" / host / "home.txt").read_text() == "home %s\n" % host
    assert (tmp / "fetched" / host / "templated.txt").read_text() == "templated %s for pveops\n" % host


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_become_inside_the_container_and_nothing_left_under_a_literal_tilde(results, host):
    r = results[0]
    assert r["become nobody inside the container, non-pipelined files readable by it"][host]["stdout"] == "nobody"
    assert not r["cleanup"][host].get("failed")
    assert r["no literal ~pveops anywhere"][host]["stdout"].strip() == "clean"


def test_ssh_only_variables_are_warned_about_once_and_change_nothing(tmp_path):
    """An inventory written for ssh (ansible_ssh_pipelining=false): one warning per name, and the tasks still run."""
    import json
    import os
    import subprocess

    status = lab_status()
    hosts = {
        name: base_vars(status, ansible_user=user, ansible_ssh_pipelining=False, ansible_ssh_transfer_method="scp")
        for name, user in (("as_root", "root"), ("as_pveops", "pveops"))
    }
    (tmp_path / "inv.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    (tmp_path / "play.yml").write_text(
        "- hosts: all\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.command: id -un\n    - ansible.builtin.command: id -un\n"
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(_h.ROOT / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(tmp_path / "cp"))
    done = subprocess.run(
        [str(_h.BIN / "ansible-playbook"), "-i", str(tmp_path / "inv.json"), str(tmp_path / "play.yml")],
        cwd=_h.ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )
    out = " ".join((done.stdout + done.stderr).split())
    assert done.returncode == 0, out[-3000:]
    assert "as_root : ok=2" in out and "as_pveops : ok=2" in out
    assert out.count("pct_ssh ignores ansible_ssh_pipelining") == 1
    assert out.count("pct_ssh ignores ansible_ssh_transfer_method") == 1
    assert "set ansible_pct_ssh_transfer_method (auto, sftp or cat) instead" in out
