"""streams.files: a file is replaced whole or not at all, and a failed write leaves no temporary file."""

from __future__ import annotations

import pytest

from streams import files


def test_a_clean_write_replaces_the_file_and_leaves_nothing_else(tmp_path):
    target = tmp_path / "report.json"
    target.write_bytes(b"old")
    files.write_bytes(target, b"new")
    assert target.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_write_cut_short_keeps_the_old_file_and_removes_its_temporary(tmp_path):
    target = tmp_path / "state.pt"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError), files.replacing(target) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".state.pt.")  # the name writers clean up at start
        tmp.write_bytes(b"half")
        raise RuntimeError("killed mid-write")
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["state.pt"]
