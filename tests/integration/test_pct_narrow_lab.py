"""The forced-command wrapper the README offers instead of a pct sudo rule (examples/pve-host/pct-narrow).

A sudo rule for ``/usr/sbin/pct`` is root on the PVE host: ``pct pull`` writes (truncating first) any host file
as root, ``pct push`` reads any, ``--skiplock`` overrides a backup's lock. The lab's ``pvenarrow`` has one rule,
``sudo -n`` of the wrapper, which lists CT200 for it. Through it the connection and the modules work as through
pct; what pct would do beyond that is refused, and nothing is read or written with more than the user's rights.
"""

from __future__ import annotations

import shlex
import subprocess
import uuid

import pytest

from tests.support.inventory import openssh_hostvars, pct_ssh_hostvars
from tests.support.lab import DECOY_CT, MAIN_CT, NARROW_USER
from tests.support.playbook import run_json_play
from tests.support.ssh import on_host

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

REFUSED = 77  # the wrapper's exit status when it refuses


@pytest.fixture(scope="module")
def outcome(lab, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pct_narrow")
    payload = "narrow %s\n" % uuid.uuid4().hex
    wrapper = lab["pct_narrow"]
    via = {"ansible_user": NARROW_USER, "proxmox_pct_path": wrapper}
    hosts = {
        "ct": pct_ssh_hostvars(lab, it_payload=payload, it_fetch=str(tmp / "fetched"), **via),
        "decoy": pct_ssh_hostvars(lab, proxmox_vmid=int(DECOY_CT), **via),
        "pve": openssh_hostvars(lab, ansible_user=NARROW_USER, it_vmid=int(MAIN_CT), it_wrapper=wrapper),
    }
    return run_json_play(tmp, hosts, "pct_narrow", timeout=240), payload, tmp


def narrow(lab: dict, *args: str) -> subprocess.CompletedProcess:
    return on_host(lab, "sudo -n %s" % shlex.join([lab["pct_narrow"], *args]), user=NARROW_USER, check=False)


def test_the_connection_and_the_modules_work_through_the_wrapper(outcome):
    results, payload, tmp = outcome
    assert results["whoami"]["ct"]["stdout"] == "root"
    assert results["copy"]["ct"].get("changed") and not results["copy"]["ct"].get("failed"), results["copy"]["ct"]
    assert (tmp / "fetched").read_text() == payload
    assert results["exec"]["pve"]["stdout"] == "ct200\n" and results["exec"]["pve"]["cmd"][:3] == [
        "sudo", "-n", results["exec"]["pve"]["cmd"][2]]
    assert results["status"]["pve"]["ct_status"] == "running"


def test_a_container_not_listed_for_the_user_is_refused(outcome):
    r = outcome[0]["try"]["decoy"]
    assert r.get("failed") and r["rc"] == REFUSED, r
    assert "pct-narrow: CT %s is not listed for %s" % (DECOY_CT, NARROW_USER) in r["stderr"], r


def test_what_a_pct_rule_would_allow_beyond_the_job_is_refused(lab):
    # pct itself: no rule
    res = on_host(lab, "sudo -n /usr/sbin/pct status %s" % MAIN_CT, user=NARROW_USER, check=False)
    assert res.returncode != 0 and "a password is required" in res.stderr, res.stderr
    # --skiplock would override a backup's lock
    res = narrow(lab, "start", MAIN_CT, "--skiplock", "1")
    assert (res.returncode, res.stderr) == (REFUSED, "pct-narrow: --skiplock overrides a backup's lock; not allowed\n")
    # push reads the source as the user: root's files do not reach the container
    res = narrow(lab, "push", MAIN_CT, "/etc/shadow", "/tmp/pct-narrow-shadow")
    assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr
    assert on_host(lab, "pct exec %s -- test -e /tmp/pct-narrow-shadow" % MAIN_CT, check=False).returncode == 1
    # pull writes the destination as the user: a host file the user may not write is left alone
    before = on_host(lab, "sha256sum /etc/hostname").stdout
    res = narrow(lab, "pull", MAIN_CT, "/etc/hostname", "/etc/hostname")
    assert res.returncode != 0 and "Permission denied" in res.stderr, res.stderr
    assert on_host(lab, "sha256sum /etc/hostname").stdout == before
    # only the job's subcommands
    res = narrow(lab, "destroy", MAIN_CT)
    assert res.returncode == REFUSED and "pct destroy is not allowed" in res.stderr, res.stderr
