"""The lab's lanes (tests/lab/lanes.py): no two lanes share a place, lane 0 is the README's lab, and a lane's
inventory is the checkout's with that lane's facts; which lane a test process is on (tests/support/paths.py)."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import yaml

from tests.conftest import lab_order_key
from tests.support.paths import LAB_DIR, ROOT, load_script, select_lane

lanes = load_script(LAB_DIR / "lanes.py", "gpuops_lab_lanes")
ALL = [lanes.lane(index) for index in range(lanes.MAX_LANES)]


def test_lane_zero_is_the_readme_lab() -> None:
    zero = lanes.lane(0)
    assert (zero.lab_dir, zero.port, zero.port2) == ("/var/lib/gpuops-lab", 2222, 2223)
    assert zero.vmids == {"main": "200", "decoy": "201", "node2": "210"}
    assert (zero.sudo_user, zero.nosudo_user, zero.sudoers) == ("pveops", "pvenosudo", "/etc/sudoers.d/gpuops-lab")
    assert zero.datagen_hosts == ("127.0.0.1", "127.0.0.2")


@pytest.mark.parametrize("a,b", list(itertools.combinations(range(lanes.MAX_LANES), 2)))
def test_no_two_lanes_share_a_place(a: int, b: int) -> None:
    one, two = ALL[a], ALL[b]
    assert not (one.lab_dir + "/").startswith(two.lab_dir + "/") and not (two.lab_dir + "/").startswith(
        one.lab_dir + "/")
    assert not {one.port, one.port2} & {two.port, two.port2}
    assert not set(one.vmids.values()) & set(two.vmids.values())
    assert not {one.sudo_user, one.nosudo_user} & {two.sudo_user, two.nosudo_user}
    assert one.sudoers != two.sudoers
    assert not set(one.datagen_hosts) & set(two.datagen_hosts)


def test_lane_names_fit_the_system() -> None:
    for each in ALL:
        assert all(len(user) <= 32 for user in (each.sudo_user, each.nosudo_user))  # useradd's limit
        assert all(100 <= int(vmid) <= 999999999 for vmid in each.vmids.values())  # what PVE accepts
        assert each.port2 < 65536


@pytest.mark.parametrize("raw", ["8", "-1", "one", "1.5"])
def test_a_bad_lane_number_names_the_variable(raw: str) -> None:
    with pytest.raises(lanes.LaneError, match=r"GPUOPS_LAB_LANE=.*a lane is a number from 0 to 7"):
        lanes.lane_index(raw)


def test_unset_or_empty_is_lane_zero() -> None:
    assert lanes.lane_index(None) == lanes.lane_index("") == 0
    assert lanes.current({}).index == 0


def _inventory_files(top: Path):
    return sorted(p for p in top.rglob("*") if p.is_file() and not p.is_symlink())


@pytest.mark.parametrize("name", lanes.INVENTORIES)
def test_lane_zero_renders_the_checkouts_inventory_unchanged(name: str) -> None:
    for path in _inventory_files(ROOT / "inventories" / name):
        text = path.read_text(encoding="utf-8")
        assert lanes.render_inventory(text, lanes.lane(0)) == text


def test_a_lane_inventory_holds_that_lanes_facts_only(tmp_path: Path) -> None:
    three = lanes.lane(3, base_dir=str(tmp_path / "gpuops-lab"))
    written = lanes.write_inventories(str(ROOT / "inventories"), three)
    # the fleet inventory's group_vars link to the lab's, as in the checkout, and reach the lane's copy
    link = Path(written["lab-fleet"]) / "group_vars" / "training_containers.yml"
    target = Path(written["lab"]) / "group_vars" / "training_containers.yml"
    assert link.is_symlink() and link.resolve() == target.resolve()
    lab = yaml.safe_load((Path(written["lab"]) / "hosts.yml").read_text())["all"]["children"]
    fleet = yaml.safe_load((Path(written["lab-fleet"]) / "hosts.yml").read_text())["all"]["children"]
    assert lab["pve_hosts"]["hosts"]["lab-pve"]["ansible_port"] == three.port
    ct200 = lab["training_containers"]["hosts"]["ct200"]
    assert (ct200["proxmox_vmid"], ct200["sglang_datagen_host"]) == (int(three.main_ct), three.datagen_hosts[0])
    assert lab["training_containers"]["vars"]["ansible_port"] == three.port
    assert lab["training_containers"]["vars"]["ansible_ssh_private_key_file"] == three.lab_dir + "/ssh/id_ed25519"
    assert {h: v["ansible_port"] for h, v in fleet["pve_hosts"]["hosts"].items()} == {
        "lab-pve": three.port, "lab-pve2": three.port2}
    nodes = fleet["training_containers"]["hosts"]
    vmids = (nodes["ct200"]["proxmox_vmid"], nodes["ct210"]["proxmox_vmid"])
    assert vmids == (int(three.main_ct), int(three.node2_ct))
    assert (nodes["ct200"]["sglang_datagen_host"], nodes["ct210"]["sglang_datagen_host"]) == three.datagen_hosts
    group_vars = (Path(written["lab"]) / "group_vars" / "training_containers.yml").read_text()
    assert all(src.startswith(three.lab_dir + "/files/") for src in
               (f["src"] for f in yaml.safe_load(group_vars)["sglang_datagen_extra_files"]))
    # nothing of lane 0 is left in any value
    zero = lanes.lane(0)
    for path in _inventory_files(tmp_path):
        values = "\n".join(line.split("#")[0] for line in path.read_text().splitlines())
        for fact in (zero.lab_dir + "/", str(zero.port), str(zero.port2), "proxmox_vmid: 200",
                     "sglang_datagen_host: 127.0.0."):
            assert fact not in values, (path, fact)


def test_rendering_again_changes_nothing_and_drops_what_the_checkout_dropped(tmp_path: Path) -> None:
    one = lanes.lane(1, base_dir=str(tmp_path / "gpuops-lab"))
    first = lanes.write_inventories(str(ROOT / "inventories"), one)
    stray = Path(first["lab"]) / "group_vars" / "stale.yml"
    stray.write_text("x: 1\n")
    before = {p: p.stat().st_mtime_ns for p in _inventory_files(Path(one.lab_dir))}
    lanes.write_inventories(str(ROOT / "inventories"), one)
    assert not stray.exists()
    before.pop(stray)
    assert {p: p.stat().st_mtime_ns for p in _inventory_files(Path(one.lab_dir))} == before


def test_an_xdist_worker_is_on_its_own_lane() -> None:
    env = {"PYTEST_XDIST_WORKER": "gw2"}
    lane = select_lane(env)
    assert lane.index == 2 and env["GPUOPS_LAB_LANE"] == "2"
    assert env["ANSIBLE_INVENTORY"] == lanes.lane(2).inventory("lab")  # an ansible command given no -i
    env = {"GPUOPS_LAB_LANE": "1"}
    assert select_lane(env).index == 1
    env = {}
    assert select_lane(env).index == 0 and "ANSIBLE_INVENTORY" not in env  # lane 0: ansible.cfg's own


def test_the_lab_stream_runs_the_longest_files_first_and_the_fleet_last() -> None:
    items = [("a", False, 30.0), ("b", False, 400.0), ("fleet", True, 900.0), ("c", False, 30.0), ("d", False, 90.0)]
    order = sorted(range(len(items)), key=lambda i: lab_order_key(items[i][1], items[i][2], i))
    assert [items[i][0] for i in order] == ["b", "d", "a", "c", "fleet"]
