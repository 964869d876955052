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

import pytest

from tests.support.inventory import pct_ssh_hostvars as base_vars
from tests.support.inventory import write_inventory
from tests.support.lab import SUDO_USER
from tests.support.paths import PLAYBOOKS
from tests.support.playbook import ansible_env, control_dir, run_json_play, run_playbook

pytestmark = [pytest.mark.lab, pytest.mark.timeout(400)]

# as the lane's sudo user (pveops in lane 0)
HOSTS = {"pveops_pipelined": True, "pveops_plain": False}


@pytest.fixture(scope="module")
def results(lab, tmp_path_factory):
    status = lab
    tmp = tmp_path_factory.mktemp("pct_ssh_nonroot")
    template = PLAYBOOKS / "templates" / "pct_ssh_nonroot.j2"
    hosts = {
        name: base_vars(
            status,
            ansible_user=SUDO_USER,
            ansible_pipelining=pipelining,
            it_template=str(template),
            it_fetch=str(tmp / "fetched" / name),
        )
        for name, pipelining in HOSTS.items()
    }
    return run_json_play(tmp, hosts, "pct_ssh_nonroot"), tmp


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
    assert (tmp / "fetched" / host / "templated.txt").read_text() == "templated %s for %s\n" % (host, SUDO_USER)


@pytest.mark.parametrize("host", sorted(HOSTS))
def test_become_inside_the_container_and_nothing_left_under_a_literal_tilde(results, host):
    r = results[0]
    assert r["become nobody inside the container, non-pipelined files readable by it"][host]["stdout"] == "nobody"
    assert not r["cleanup"][host].get("failed")
    assert r["no literal ~pveops anywhere"][host]["stdout"].strip() == "clean"


def test_ssh_only_variables_are_warned_about_once_and_change_nothing(lab, tmp_path):
    """An inventory written for ssh (ansible_ssh_pipelining=false): one warning per name, and the tasks still run."""
    hosts = {
        name: base_vars(lab, ansible_user=user, ansible_ssh_pipelining=False, ansible_ssh_transfer_method="scp")
        for name, user in (("as_root", "root"), ("as_pveops", SUDO_USER))
    }
    inventory = write_inventory(tmp_path / "inv.json", hosts)
    done = run_playbook("id_twice", inventory, env=ansible_env(ANSIBLE_PCT_SSH_CONTROL_PATH_DIR=str(control_dir(tmp_path))),
                        timeout=240)
    out = " ".join(done.output.split())
    assert done.rc == 0, out[-3000:]
    assert "as_root : ok=2" in out and "as_pveops : ok=2" in out
    assert out.count("pct_ssh ignores ansible_ssh_pipelining") == 1
    assert out.count("pct_ssh ignores ansible_ssh_transfer_method") == 1
    assert "set ansible_pct_ssh_transfer_method (auto, sftp or cat) instead" in out
