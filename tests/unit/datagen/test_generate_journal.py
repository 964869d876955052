"""generate: the durable output file: torn-tail repair, the resume index, quarantine, the append log."""

from __future__ import annotations

import json
import os

from datagen.gen.journal import AppendLog, DoneIndex, count_lines, digest, quarantine, repair_tail, scan_output


def _row(i):
    return json.dumps({"id": f"{i:024x}", "messages": [{"role": "user", "content": f"q{i}"}]},
                      separators=(",", ":")) + "\n"


def test_torn_last_line_is_cut_and_returned(tmp_path):
    path = tmp_path / "out.jsonl"
    whole = _row(1) + _row(2)
    path.write_text(whole + _row(3)[:17])
    torn = repair_tail(str(path))
    assert torn == _row(3)[:17].encode()
    assert path.read_text() == whole
    assert repair_tail(str(path)) == b""  # idempotent: a whole file is left alone
    assert path.read_text() == whole


def test_a_complete_looking_line_without_newline_is_still_torn(tmp_path):
    # the newline is the commit mark: a row whose newline never reached the disk is regenerated
    path = tmp_path / "out.jsonl"
    path.write_text(_row(1) + _row(2).rstrip("\n"))
    assert repair_tail(str(path)) == _row(2).rstrip("\n").encode()
    assert path.read_text() == _row(1)


def test_nul_padding_after_power_loss_is_cut(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_bytes(_row(1).encode() + b'{"id":"00' + b"\x00" * 70000)
    repair_tail(str(path))
    assert path.read_bytes() == _row(1).encode()


def test_file_without_any_newline_is_emptied_and_missing_file_is_fine(tmp_path):
    path = tmp_path / "out.jsonl"
    path.write_text('{"id": "abc", "mess')
    repair_tail(str(path))
    assert path.read_bytes() == b""
    assert repair_tail(str(tmp_path / "absent.jsonl")) == b""


def test_scan_finds_ids_and_bad_lines_and_quarantine_moves_them(tmp_path):
    path = tmp_path / "out.jsonl"
    # a row written by another tool (id not first, escaped id) still counts: the slow path parses it
    other = json.dumps({"messages": [], "id": "odd\\id"}) + "\n"
    path.write_text(_row(1) + "\x00\x00garbage\n" + other + "\n" + _row(2) + '{"no_id": 1}\n')
    done, rows, bad = scan_output(str(path))
    assert rows == 3 and len(done) == 3
    assert f"{1:024x}" in done and f"{2:024x}" in done and "odd\\id" in done
    assert f"{3:024x}" not in done and None not in done
    assert len(bad) == 2
    side = tmp_path / "out.jsonl.corrupt"
    quarantine(str(path), bad, str(side))
    assert path.read_text() == _row(1) + other + _row(2)
    assert side.read_bytes().count(b"\n") == 2
    assert scan_output(str(path))[2] == []


def test_done_index_is_compact_and_exact():
    ids = [f"{i:024x}" for i in range(0, 20000, 2)]
    idx = DoneIndex(digest(i) for i in ids)
    assert len(idx) == 10000
    assert all(i in idx for i in ids[:500])
    assert not any(f"{i:024x}" in idx for i in range(1, 1000, 2))
    assert idx._keys.itemsize == 8


def test_append_log_writes_only_whole_lines_and_counts(tmp_path):
    path = tmp_path / "out.jsonl"
    log = AppendLog(str(path), flush_bytes=100)
    log.add(_row(1))
    assert path.read_bytes() == b""  # buffered: a crash now loses the row, never half of it
    log.add(_row(2))  # over 100 bytes: flushed
    assert path.read_text() == _row(1) + _row(2)
    log.add("é" + _row(3)[1:])
    log.close()
    assert count_lines(str(path)) == 3
    assert os.path.getsize(path) == len((_row(1) + _row(2) + "é" + _row(3)[1:]).encode())
