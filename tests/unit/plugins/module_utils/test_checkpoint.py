"""Checkpoint integrity without torch: real files in tmp_path, cut and damaged the way saves go wrong."""

from __future__ import annotations

import importlib.util
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from ansible_collections.gpuops.repurpose.plugins.module_utils._checkpoint import file as _checkpoint_file
from ansible_collections.gpuops.repurpose.plugins.module_utils._checkpoint.newest import (
    CheckpointScan,
    Verdict,
    _Candidate,
    _newest_first,
    judge_checkpoint,
    scan_checkpoints,
    step_from_name,
)
from tests.support.paths import ROOT

pytestmark = pytest.mark.processes

NOW = 1_700_000_000.0
OLD = NOW - 600  # settled long ago


def settle(path, mtime=OLD):
    """Set mtime (a directory's: everything in it too): the unit judges by it, not by the clock."""
    path = Path(path)
    if path.is_dir():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                settle(child, mtime)
            os.utime(child, (mtime, mtime), follow_symlinks=False)
    os.utime(path, (mtime, mtime))
    return str(path)


def judge(path, **kwargs):
    return judge_checkpoint(str(path), now=NOW, **kwargs)


# --- writers -----------------------------------------------------------------------------------------


def torch_zip(path, tensors=(4096, 64), archive="archive", pickle_name="data.pkl"):
    """The members torch.save writes, in its order, stored (ZIP_STORED) as torch.save stores them."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("%s/%s" % (archive, pickle_name), pickle.dumps({"model": list(range(len(tensors)))}))
        z.writestr("%s/byteorder" % archive, "little")
        for i, size in enumerate(tensors):
            z.writestr("%s/data/%d" % (archive, i), bytes((i + j) % 251 for j in range(size)))
        z.writestr("%s/version" % archive, "3\n")
        z.writestr("%s/.data/serialization_id" % archive, "1234567890" * 4)
    return settle(path)


class Unseekable:
    """A write-only stream: zipfile then follows each member with a data descriptor (flag bit 3), as torch.save."""

    def __init__(self, path):
        self.f = open(path, "wb")  # pylint: disable=consider-using-with  # closed by close()
        self.written = 0

    def write(self, data):
        self.written += len(data)
        return self.f.write(data)

    def tell(self):
        return self.written

    def flush(self):
        self.f.flush()

    def close(self):
        self.f.close()


def torch_zip_streamed(path, tensors=(4096, 64)):
    out = Unseekable(path)
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        for i, size in enumerate(tensors):
            z.writestr("archive/data/%d" % i, bytes(size))
        z.writestr("archive/version", "3\n")
    out.close()
    return settle(path)


def with_zip64_end(data):
    """``data`` (a zip) with a zip64 end record and locator before its end record, as torch.save writes."""
    at = len(data) - 22
    fields = list(struct.unpack("<4s4H2LH", data[at:]))
    cd_size, cd_offset, entries = fields[5], fields[6], fields[4]
    record = struct.pack("<4sQ2H2L4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, entries, entries, cd_size, cd_offset)
    locator = struct.pack("<4sLQL", b"PK\x06\x07", 0, at, 1)
    end = struct.pack("<4s4H2LH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return data[:at] + record + locator + end


def safetensors_bytes(tensors, metadata=None, offsets=None, pad=True):
    """A safetensors file: ``tensors`` is name -> (dtype, shape, data); ``offsets`` overrides name -> [b, e]."""
    header, blob = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    for name, pair in (offsets or {}).items():
        header[name]["data_offsets"] = pair
    text = json.dumps(header).encode()
    if pad:
        text += b" " * (-len(text) % 8)  # upstream pads the header to 8 bytes
    return struct.pack("<Q", len(text)) + text + blob


def write(path, data, mtime=OLD):
    Path(path).write_bytes(data)
    return settle(path, mtime)


W = ("F32", [2, 128], bytes(1024))
B = ("BF16", [128], bytes(256))


def whole_safetensors(path):
    return write(path, safetensors_bytes({"model.w": W, "model.b": B}, metadata={"format": "pt"}))


# --- torch.save zips ---------------------------------------------------------------------------------


def test_torch_layout_zip_is_whole_torch_zip(tmp_path):
    v = judge(torch_zip(tmp_path / "ckpt-step000010.pt"))
    assert (v.whole, v.kind, v.why, v.step) == (True, "torch-zip", "", 10)
    assert v.size == (tmp_path / "ckpt-step000010.pt").stat().st_size and v.mtime == OLD


@pytest.mark.parametrize("cut", [1, 21, 22, 23, 200, 0.5, 0.9])
def test_torch_zip_cut_short_anywhere_is_truncated(tmp_path, cut):
    whole = Path(torch_zip(tmp_path / "full.pt")).read_bytes()
    keep = len(whole) - cut if isinstance(cut, int) else int(len(whole) * cut)
    v = judge(write(tmp_path / "ckpt-3.pt", whole[:keep]))
    assert not v.whole
    assert v.kind == "torch-zip"  # told by the first local header even with the end record gone
    assert v.why.startswith("truncated: no zip end record") and str(keep) in v.why


def test_zip_without_data_pkl_is_a_plain_zip(tmp_path):
    v = judge(torch_zip(tmp_path / "bundle.zip", pickle_name="other.pkl"))
    assert (v.whole, v.kind) == (True, "zip")


def test_zip_with_bytes_lost_in_the_middle_does_not_add_up(tmp_path):
    data = Path(torch_zip(tmp_path / "full.pt")).read_bytes()
    v = judge(write(tmp_path / "ckpt.pt", data[:1000] + data[1100:]))  # inside data/0: the directory still reads
    assert not v.whole and v.kind == "torch-zip"
    assert "central directory" in v.why and "does not end at the end record" in v.why


def test_zip_member_larger_than_the_file_is_truncated(tmp_path):
    path = Path(torch_zip(tmp_path / "ckpt.pt"))
    data = bytearray(path.read_bytes())
    at = data.rfind(b"PK\x01\x02")  # the last central header: archive/.data/serialization_id
    (size,) = struct.unpack_from("<L", data, at + 20)
    struct.pack_into("<L", data, at + 20, size + 4096)  # its compressed size, as if the data ran on
    v = judge(write(path, bytes(data)))
    assert not v.whole and v.kind == "torch-zip"
    assert v.why.startswith("truncated: member archive/.data/serialization_id ends at")


def test_zip_with_bytes_after_the_end_record_is_not_whole(tmp_path):
    data = Path(torch_zip(tmp_path / "full.pt")).read_bytes()
    v = judge(write(tmp_path / "ckpt.pt", data + b"\0" * 10))  # e.g. a second save appended
    assert not v.whole and "does not end the file" in v.why


def test_zip_with_data_descriptors_is_whole_and_cut_is_not(tmp_path):
    path = torch_zip_streamed(tmp_path / "ckpt.pt")
    with zipfile.ZipFile(path) as z:
        assert all(i.flag_bits & 0x08 for i in z.infolist())  # the layout torch.save writes
    assert judge(path).whole
    data = Path(path).read_bytes()
    at = data.find(b"PK\x01\x02")  # the central directory, right after the last member's descriptor
    v = judge(write(tmp_path / "short.pt", data[:at - 16] + data[at:]))  # that descriptor lost
    assert not v.whole and v.kind == "torch-zip"


def test_zip64_end_records(tmp_path):
    data = Path(torch_zip(tmp_path / "plain.pt")).read_bytes()
    zip64 = with_zip64_end(data)
    with zipfile.ZipFile(write(tmp_path / "ckpt.pt", zip64)) as z:  # zipfile reads it too
        assert len(z.infolist()) == 6
    assert judge(tmp_path / "ckpt.pt").whole
    record_at = len(data) - 22
    moved = zip64[:record_at + 56] + struct.pack("<4sLQL", b"PK\x06\x07", 0, record_at - 8, 1) + zip64[-22:]
    v = judge(write(tmp_path / "moved.pt", moved))
    assert not v.whole and v.why == "zip64 end record missing at %d" % (record_at - 8)


def test_zip_end_record_with_a_comment_still_ends_the_file(tmp_path):
    path = tmp_path / "ckpt.pt"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("a/data.pkl", b"x" * 100)
        z.comment = b"saved by hand"
    assert judge(settle(path)).whole


# --- safetensors -------------------------------------------------------------------------------------


def test_safetensors_whole(tmp_path):
    v = judge(whole_safetensors(tmp_path / "model.safetensors"))
    assert (v.whole, v.kind, v.why) == (True, "safetensors", "")


def test_safetensors_with_no_tensors_is_whole(tmp_path):
    # upstream's own golden bytes for an empty file: 8, then "{}" padded with spaces
    v = judge(write(tmp_path / "empty.safetensors", bytes([8, 0, 0, 0, 0, 0, 0, 0]) + b"{}      "))
    assert (v.whole, v.kind) == (True, "safetensors")


def test_safetensors_recognised_by_content_whatever_its_name(tmp_path):
    data = safetensors_bytes({"w": W})
    assert judge(write(tmp_path / "ckpt-7.bin", data)).kind == "safetensors"
    v = judge(write(tmp_path / "ckpt-8.bin", data[:-1]))
    assert (v.whole, v.kind) == (False, "safetensors")


def test_safetensors_truncated_by_one_byte(tmp_path):
    data = Path(whole_safetensors(tmp_path / "full.safetensors")).read_bytes()
    v = judge(write(tmp_path / "model.safetensors", data[:-1]))
    assert not v.whole and v.kind == "safetensors"
    # the tensor that ran off the end (the last one written), where it ends, what the file has
    assert v.why == "truncated: tensor model.b ends at %d, file has %d bytes" % (len(data), len(data) - 1)


def test_safetensors_header_length_beyond_the_file(tmp_path):
    data = Path(whole_safetensors(tmp_path / "full.safetensors")).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    v = judge(write(tmp_path / "model.safetensors", data[: 8 + n // 2]))
    assert not v.whole and v.why == "truncated: header ends at %d, file has %d bytes" % (8 + n, 8 + n // 2)


def test_safetensors_insane_header_length(tmp_path):
    v = judge(write(tmp_path / "model.safetensors", struct.pack("<Q", 200_000_000) + b"{}" + bytes(100)))
    assert not v.whole and "not sane" in v.why


def test_safetensors_shorter_than_its_length_field(tmp_path):
    v = judge(write(tmp_path / "model.safetensors", b"\x10\x00\x00"))
    assert not v.whole and v.why.startswith("truncated: 3 bytes")


@pytest.mark.parametrize("header, why", [
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]', "header is not JSON"),
    (b"\xff\xfe{}", "header is not JSON"),
    (b"[1, 2, 3]", "header is not a JSON object"),
    (b'{"w": {"shape": [1], "data_offsets": [0, 4]}}', "tensor w: no dtype"),
    (b'{"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}', "tensor w: shape"),
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4]}}', "tensor w: data_offsets"),
    (b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": [4, 0]}}', "end before they begin"),
    (b'{"__metadata__": {"n": 1}, "w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}', "__metadata__"),
])
def test_safetensors_bad_header(tmp_path, header, why):
    v = judge(write(tmp_path / "model.safetensors", struct.pack("<Q", len(header)) + header + bytes(4)))
    assert not v.whole and v.kind == "safetensors" and why in v.why


def test_safetensors_offsets_holding_the_wrong_size(tmp_path):
    # F32 [2, 128] needs 1024 bytes: offsets that say 1016 (and a file that has them) are not this tensor
    data = safetensors_bytes({"model.w": ("F32", [2, 128], bytes(1016))})
    v = judge(write(tmp_path / "model.safetensors", data))
    assert not v.whole
    assert v.why == "tensor model.w: data_offsets [0, 1016] hold 1016 bytes, F32 shape [2, 128] needs 1024"


def test_safetensors_overlapping_tensors(tmp_path):
    # b claims bytes 512..768, inside w: the sizes fit their dtypes, the tiling does not
    data = safetensors_bytes({"model.w": W, "model.b": B}, offsets={"model.b": [512, 768]})
    v = judge(write(tmp_path / "model.safetensors", data[:-256]))
    assert not v.whole and "overlaps" in v.why


def test_safetensors_gap_and_trailing_bytes(tmp_path):
    gap = safetensors_bytes({"model.w": W, "model.b": B}, offsets={"model.b": [1032, 1288]}) + bytes(8)
    v = judge(write(tmp_path / "gap.safetensors", gap))
    assert not v.whole and v.why == "8 bytes unaccounted for before tensor model.b"
    v = judge(write(tmp_path / "tail.safetensors", safetensors_bytes({"model.w": W}) + b"\0"))
    assert not v.whole and v.why.startswith("1 bytes after the last tensor")


def test_safetensors_sub_byte_dtype(tmp_path):
    assert judge(write(tmp_path / "a.safetensors", safetensors_bytes({"q": ("F4", [2, 3], bytes(3))}))).whole
    v = judge(write(tmp_path / "b.safetensors", safetensors_bytes({"q": ("F4", [3], bytes(2))})))
    assert not v.whole and "not a whole number of bytes" in v.why


def test_safetensors_unknown_dtype_is_whole_but_says_so(tmp_path):
    v = judge(write(tmp_path / "model.safetensors", safetensors_bytes({"q": ("F2_NEW", [4], bytes(1)), "w": W})))
    assert v.whole and v.why == "dtype F2_NEW not known: those sizes not checked"


# --- partial, unknown, missing -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["ckpt-step5.pt.tmp", "ckpt-step5.pt.partial", "ckpt-step5.pt.incomplete",
                                  "ckpt-step5.pt.tmp.8812", "CKPT-STEP5.PT.TMP"])
def test_partial_names(tmp_path, name):
    v = judge(torch_zip(tmp_path / name))  # a whole archive: the name alone says the rename has not happened
    assert (v.whole, v.kind, v.step) == (False, "partial", 5) and "save in progress" in v.why
    if ".tmp." in name:
        assert v.why.startswith("named *.tmp.*")


def test_a_file_still_growing_is_partial_until_it_settles(tmp_path):
    path = torch_zip(tmp_path / "ckpt.pt")
    settle(path, NOW - 0.5)
    v = judge(path)
    assert (v.whole, v.kind) == (False, "partial") and "0.5s ago" in v.why
    assert judge(path, settle=0.1).whole
    settle(path, NOW + 30)  # a writer whose clock runs ahead
    assert "in the future" in judge(path).why


def test_empty_file_is_partial(tmp_path):
    v = judge(write(tmp_path / "ckpt.pt", b""))
    assert (v.whole, v.kind, v.why) == (False, "partial", "empty file")


def test_unknown_format_is_whole_unchecked(tmp_path):
    v = judge(write(tmp_path / "ckpt-step9.npz.gz", b"\x1f\x8b" + bytes(100)))
    assert (v.whole, v.kind, v.step) == (True, "file", 9) and "not checked" in v.why


def test_missing_and_not_regular(tmp_path):
    v = judge(tmp_path / "ckpt-step4.pt")
    assert (v.whole, v.kind, v.step, v.size) == (False, "missing", 4, 0)
    os.mkfifo(tmp_path / "fifo")
    v = judge(tmp_path / "fifo")
    assert (v.whole, v.why) == (False, "not a regular file")


def test_unreadable_file_is_a_verdict_not_an_exception(tmp_path, monkeypatch):
    path = torch_zip(tmp_path / "ckpt.pt")

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_checkpoint_file, "open", refuse, raising=False)
    v = judge(path)
    assert (v.whole, v.why) == (False, "unreadable: Permission denied")


@pytest.mark.parametrize("name, step", [
    ("ckpt-step000682.bin", 682), ("checkpoint-1500", 1500), ("ckpt-000012.pt", 12), ("global_step1500", 1500),
    ("epoch=3-step=1500.ckpt", 1500), ("step_100", 100), ("iter_0001000", 1000), ("model.safetensors", None),
    ("ckpt-000012.pt.tmp.4411", 12), ("ckpt-step7.pt.partial", 7), ("run3-ckpt-000040.pt", 40),
    ("weights.h5", None), ("/a/b/checkpoint-20/", 20), ("latest", None),
])
def test_step_from_name(name, step):
    assert step_from_name(name) == step


# --- directories -------------------------------------------------------------------------------------


def dcp_dir(path, shards=("__0_0.distcp", "__1_0.distcp")):
    """A torch.distributed.checkpoint layout: shards, and ``.metadata`` (a pickle naming them) last."""
    path.mkdir()
    for shard in shards:
        (path / shard).write_bytes(bytes(64))
    storage = {"model.w/%d" % i: {"relative_path": s, "offset": 0, "length": 64} for i, s in enumerate(shards)}
    (path / ".metadata").write_bytes(pickle.dumps({"storage_data": storage}))
    return settle(path)


def test_dcp_whole(tmp_path):
    v = judge(dcp_dir(tmp_path / "step_200"))
    assert (v.whole, v.kind, v.why, v.step, v.size) == (True, "dcp", "", 200, v.size)
    assert v.size > 128


def test_dcp_without_metadata_did_not_finish(tmp_path):
    path = dcp_dir(tmp_path / "step_200")
    os.remove(os.path.join(path, ".metadata"))
    v = judge(settle(path))
    assert not v.whole and v.why == ".metadata missing: the save did not finish"


def test_dcp_metadata_being_written_is_partial(tmp_path):
    path = dcp_dir(tmp_path / "step_200")
    os.rename(os.path.join(path, ".metadata"), os.path.join(path, ".metadata.tmp"))
    v = judge(settle(path))
    assert (v.whole, v.kind) == (False, "partial") and v.why.startswith(".metadata.tmp inside")


def test_dcp_empty_shard_and_shard_still_growing(tmp_path):
    path = dcp_dir(tmp_path / "step_200")
    Path(path, "__0_0.distcp").write_bytes(b"")
    v = judge(settle(path))
    assert not v.whole and v.why == "__0_0.distcp is empty"
    Path(path, "__0_0.distcp").write_bytes(bytes(64))
    settle(path)
    os.utime(os.path.join(path, "__0_0.distcp"), (NOW - 1, NOW - 1))  # the folder's mtime does not move
    v = judge(path)
    assert (v.whole, v.kind) == (False, "partial") and v.mtime == NOW - 1


def hf_dir(path, shards=2):
    path.mkdir()
    weight_map = {}
    for i in range(1, shards + 1):
        name = "model-%05d-of-%05d.safetensors" % (i, shards)
        (path / name).write_bytes(safetensors_bytes({"layer%d.w" % i: W}))
        weight_map["layer%d.w" % i] = name
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text("{}")
    return settle(path)


def test_hf_sharded_whole(tmp_path):
    v = judge(hf_dir(tmp_path / "checkpoint-1500"))
    assert (v.whole, v.kind, v.why, v.step) == (True, "hf", "", 1500)


@pytest.mark.parametrize("make, shard, kind, why", [
    (lambda tmp: dcp_dir(tmp / "step_200"), "__1_0.distcp", "dcp", "shard __1_0.distcp named in .metadata is missing"),
    (lambda tmp: hf_dir(tmp / "checkpoint-1500", shards=3), "model-00002-of-00003.safetensors", "hf",
     "shard model-00002-of-00003.safetensors named by model.safetensors.index.json is missing"),
], ids=["dcp", "hf"])
def test_a_shard_its_index_names_is_missing(tmp_path, make, shard, kind, why):
    path = make(tmp_path)
    os.remove(os.path.join(path, shard))
    v = judge(settle(path))
    assert (v.whole, v.kind, v.why) == (False, kind, why)


def test_hf_truncated_shard(tmp_path):
    path = hf_dir(tmp_path / "checkpoint-1500")
    shard = Path(path, "model-00002-of-00002.safetensors")
    shard.write_bytes(shard.read_bytes()[:-100])
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("model-00002-of-00002.safetensors: truncated: tensor layer2.w")


def test_hf_shards_without_their_index(tmp_path):
    path = hf_dir(tmp_path / "checkpoint-1500")
    os.remove(os.path.join(path, "model.safetensors.index.json"))
    v = judge(settle(path))
    assert not v.whole and "named by no index" in v.why


def test_hf_bad_index_and_bad_config(tmp_path):
    path = hf_dir(tmp_path / "checkpoint-1500")
    Path(path, "model.safetensors.index.json").write_text('{"weight_map": {"a": ')
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("model.safetensors.index.json does not parse")
    path = hf_dir(tmp_path / "checkpoint-1600")
    Path(path, "config.json").write_text('{"hidden_size": 4')
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("config.json does not parse")


def test_hf_single_weights_file_and_torch_bin(tmp_path):
    path = tmp_path / "checkpoint-10"
    path.mkdir()
    whole_safetensors(path / "model.safetensors")
    torch_zip(path / "optimizer.pt")
    assert judge(settle(path)).whole
    data = (path / "optimizer.pt").read_bytes()
    (path / "optimizer.pt").write_bytes(data[:-50])  # the Trainer's other files are judged as well
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("optimizer.pt: truncated")
    bin_dir = tmp_path / "checkpoint-20"
    bin_dir.mkdir()
    (bin_dir / "pytorch_model.bin").write_bytes(Path(torch_zip(tmp_path / "x.pt")).read_bytes()[:-1])
    v = judge(settle(bin_dir))
    assert (v.whole, v.kind) == (False, "hf") and v.why.startswith("pytorch_model.bin: truncated")


def test_plain_directory_of_torch_files(tmp_path):
    path = tmp_path / "global_step300"
    path.mkdir()
    torch_zip(path / "mp_rank_00_model_states.pt")
    torch_zip(path / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    v = judge(settle(path))
    assert (v.whole, v.kind, v.why, v.step) == (True, "dir", "", 300)
    (path / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"PK\x03\x04" + bytes(100))
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("zero_pp_rank_0_mp_rank_00_optim_states.pt: truncated")


def test_plain_directory_one_level_down(tmp_path):
    path = tmp_path / "iter_0000500"
    (path / "mp_rank_00").mkdir(parents=True)
    torch_zip(path / "mp_rank_00" / "model_optim_rng.pt")
    assert judge(settle(path)).whole
    Path(path, "mp_rank_00", "model_optim_rng.pt").write_bytes(b"PK\x03\x04" + bytes(10))
    v = judge(settle(path))
    assert not v.whole and v.why.startswith("mp_rank_00/model_optim_rng.pt: truncated")


def test_directory_without_checkpoint_files(tmp_path):
    path = tmp_path / "runs"
    path.mkdir()
    write(path / "events.out.tfevents.1.host", b"x" * 10)
    write(path / "config.json", b"{}")
    v = judge(settle(path))
    assert (v.whole, v.kind, v.why) == (False, "dir", "no checkpoint file in it")
    empty = tmp_path / "checkpoint-5"
    empty.mkdir()
    assert judge(settle(empty)).why == "empty directory"


# --- scanning ----------------------------------------------------------------------------------------


def test_scan_skips_a_newer_tmp_for_the_previous_whole_one(tmp_path):
    torch_zip(tmp_path / "ckpt-000010.pt")
    torch_zip(tmp_path / "ckpt-000011.pt.tmp")
    scan = scan_checkpoints([str(tmp_path)], now=NOW)
    assert scan.newest_whole.path == str(tmp_path / "ckpt-000010.pt") and scan.newest_whole.step == 10
    assert [v.path for v in scan.skipped] == [str(tmp_path / "ckpt-000011.pt.tmp")]
    assert scan.candidates == 2


def test_scan_skips_a_file_still_growing(tmp_path):
    torch_zip(tmp_path / "ckpt-step5.pt")
    settle(torch_zip(tmp_path / "ckpt-step6.pt"), NOW - 0.2)
    scan = scan_checkpoints([str(tmp_path)], now=NOW)
    assert scan.newest_whole.step == 5
    assert [(v.step, v.kind) for v in scan.skipped] == [(6, "partial")]


def test_scan_orders_by_step_over_mtime(tmp_path):
    torch_zip(tmp_path / "ckpt-step100.pt")
    settle(torch_zip(tmp_path / "ckpt-step90.pt"), OLD + 60)  # copied back later: newer mtime, older step
    settle(torch_zip(tmp_path / "ckpt-step80.pt"), OLD + 120)
    assert scan_checkpoints([str(tmp_path)], now=NOW).newest_whole.step == 100
    data = (tmp_path / "ckpt-step100.pt").read_bytes()
    write(tmp_path / "ckpt-step100.pt", data[:-10])
    scan = scan_checkpoints([str(tmp_path)], now=NOW)
    assert scan.newest_whole.step == 90 and [v.step for v in scan.skipped] == [100]


def test_scan_mixed_kinds_newest_first(tmp_path):
    dcp_dir(tmp_path / "step_300")
    whole_safetensors(tmp_path / "step_200.safetensors")
    hf_dir(tmp_path / "step_400")
    os.remove(tmp_path / "step_400" / "model-00001-of-00002.safetensors")
    settle(tmp_path / "step_400")
    scan = scan_checkpoints([str(tmp_path)], patterns=["step_*"], now=NOW)
    assert (scan.newest_whole.kind, scan.newest_whole.step) == ("dcp", 300)
    assert [(v.kind, v.step) for v in scan.skipped] == [("hf", 400)]
    assert scan.candidates == 3


def test_scan_nothing_whole(tmp_path):
    write(tmp_path / "ckpt-1.pt", b"PK\x03\x04" + bytes(40))
    write(tmp_path / "ckpt-2.pt", b"")
    scan = scan_checkpoints([str(tmp_path)], now=NOW)
    assert scan.newest_whole is None and [v.step for v in scan.skipped] == [2, 1]
    assert scan.as_dict()["newest_whole"] is None


def test_scan_missing_paths_give_an_empty_scan(tmp_path):
    scan = scan_checkpoints([str(tmp_path / "nope"), str(tmp_path / "nope.pt")], now=NOW)
    assert scan == CheckpointScan(None, (), 0)
    assert scan.as_dict() == {"newest_whole": None, "skipped": [], "candidates": 0}


def test_scan_leaves_out_pointers_hidden_and_bookkeeping_files(tmp_path):
    torch_zip(tmp_path / "global_step5.pt")
    settle(torch_zip(tmp_path / ".global_step9.pt.Xy12Ab"), OLD + 100)  # rsync's in-flight copy
    write(tmp_path / "latest", b"global_step5", mtime=OLD + 100)  # DeepSpeed's pointer
    os.symlink("global_step5.pt", tmp_path / "latest_link")
    write(tmp_path / "latest_checkpointed_iteration.txt", b"9", mtime=OLD + 100)  # Megatron's
    write(tmp_path / "trainer_state.json", b"{}", mtime=OLD + 100)
    write(tmp_path / "README.md", b"notes", mtime=OLD + 100)
    scan = scan_checkpoints([str(tmp_path)], now=NOW)
    assert scan.candidates == 1 and scan.newest_whole.step == 5


def test_scan_patterns_files_and_limit(tmp_path):
    for i in range(1, 6):
        torch_zip(tmp_path / ("ckpt-%d.pt" % i))
        write(tmp_path / ("ckpt-%d.pt.tmp" % (i + 10)), b"x")
    write(tmp_path / "other-99.pt", b"x")
    scan = scan_checkpoints([str(tmp_path)], patterns=["ckpt-*"], now=NOW)
    assert scan.candidates == 10 and scan.newest_whole.step == 5 and len(scan.skipped) == 5
    bounded = scan_checkpoints([str(tmp_path)], patterns=["ckpt-*"], now=NOW, limit=3)
    assert bounded.newest_whole is None and [v.step for v in bounded.skipped] == [15, 14, 13]
    one = scan_checkpoints([str(tmp_path / "ckpt-2.pt"), str(tmp_path)], patterns=["ckpt-2*"], now=NOW)
    assert one.candidates == 1 and one.newest_whole.path == str(tmp_path / "ckpt-2.pt")  # the same file once


def test_scan_never_descends_into_folders_it_does_not_judge(tmp_path):
    (tmp_path / "old").mkdir()
    torch_zip(tmp_path / "old" / "ckpt-999.pt")
    torch_zip(tmp_path / "ckpt-1.pt")
    scan = scan_checkpoints([str(tmp_path)], patterns=["ckpt-*"], now=NOW)
    assert scan.newest_whole.step == 1 and scan.candidates == 1


def test_newest_first_merges_stepped_and_unstepped_by_mtime():
    c = _Candidate
    order = _newest_first([c("s10", 10, 50.0), c("s5", 5, 30.0), c("final", None, 40.0), c("x", None, 10.0)])
    assert [x.path for x in order] == ["s10", "final", "s5", "x"]
    assert [x.path for x in _newest_first([c("a", 3, 1.0), c("b", 3, 2.0)])] == ["b", "a"]  # same step: mtime


def test_verdict_as_dict():
    v = Verdict("/c/ckpt-1.pt", True, "torch-zip", "", 1, 2.5, 10)
    assert v.as_dict() == {"path": "/c/ckpt-1.pt", "whole": True, "kind": "torch-zip", "why": "", "step": 1,
                           "mtime": 2.5, "size": 10}
    assert CheckpointScan(v, (), 1).as_dict()["newest_whole"] == v.as_dict()


# --- real torch, where the lab's cached CPU venv (or this interpreter) has it -------------------------


def torch_python() -> str | None:
    if importlib.util.find_spec("torch") is not None:
        return sys.executable
    script = ROOT / "tests" / "lab" / "torchrun_job" / "torch-venv"
    try:
        done = subprocess.run([str(script), "--check"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    python = os.path.join(done.stdout.strip(), "bin", "python")
    return python if done.returncode == 0 and os.access(python, os.X_OK) else None


REAL_SAVE = """
    import io, os, sys, torch
    import torch.distributed.checkpoint as dcp
    out = sys.argv[1]
    state = {"step": 12, "model": {"w": torch.randn(64, 32), "b": torch.zeros(32, dtype=torch.bfloat16)}}
    torch.save(state, os.path.join(out, "ckpt-000012.pt"))
    buf = io.BytesIO()  # as tests/lab/torchrun_job/train.py: into memory, then a .tmp, then a rename
    torch.save(state, buf)
    with open(os.path.join(out, "ckpt-000013.pt.tmp"), "wb") as f:
        f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
    dcp.save(state, checkpoint_id=os.path.join(out, "dcp-step12"))
"""


def test_real_torch_save_and_dcp(tmp_path):
    python = torch_python()
    if python is None:
        pytest.skip("no torch here: neither this interpreter nor tests/lab/torchrun_job/torch-venv --check")
    done = subprocess.run([python, "-W", "ignore", "-c", textwrap.dedent(REAL_SAVE), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    for child in tmp_path.iterdir():
        settle(child)
    v = judge(tmp_path / "ckpt-000012.pt")
    assert (v.whole, v.kind, v.why) == (True, "torch-zip", "")
    data = (tmp_path / "ckpt-000012.pt").read_bytes()
    for keep in (len(data) - 1, len(data) - 200, len(data) // 2, 100):
        v = judge(write(tmp_path / "cut.pt", data[:keep]))
        assert (v.whole, v.kind) == (False, "torch-zip") and v.why.startswith("truncated"), keep
    os.remove(tmp_path / "cut.pt")
    v = judge(tmp_path / "dcp-step12")
    assert (v.whole, v.kind, v.why) == (True, "dcp", "")
    scan = scan_checkpoints([str(tmp_path)], patterns=["ckpt-*"], now=NOW)
    assert scan.newest_whole.path == str(tmp_path / "ckpt-000012.pt")
    assert [(v.step, v.kind) for v in scan.skipped] == [(13, "partial")]
    shards = [p for p in (tmp_path / "dcp-step12").iterdir() if p.name.endswith(".distcp")]
    shards[0].rename(shards[0].with_name("__9_9.distcp"))  # the shard the metadata names is gone
    v = judge(settle(tmp_path / "dcp-step12"))
    assert not v.whole and v.why == "shard %s named in .metadata is missing" % shards[0].name
