"""streams.files: a file is replaced whole or not at all, and a failed write leaves no temporary file; a folder is
replaced by a complete one, and a kill mid-way leaves each of the two whole."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from streams import faults, files

ROOT = Path(__file__).resolve().parents[2]


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


def folder(path, text: str):
    path.mkdir()
    (path / "model.safetensors").write_text(text)
    return path


def test_a_folder_is_put_in_place_or_replaces_the_old_one_and_leaves_nothing_else(tmp_path):
    final = tmp_path / "v000001"
    files.replace_folder(folder(tmp_path / ".tmp-a", "first"), final)
    assert (final / "model.safetensors").read_text() == "first" and os.listdir(tmp_path) == ["v000001"]
    files.replace_folder(folder(tmp_path / ".tmp-b", "second"), final)
    assert (final / "model.safetensors").read_text() == "second" and os.listdir(tmp_path) == ["v000001"]


def test_a_kill_between_the_renames_leaves_both_folders_whole_under_dot_names(tmp_path):
    """What `replace_folder` promises of a kill at its worst instant: no `final`, and each folder complete under
    a dot name (the names a writer removes at its start), never a mix of the two."""
    final = folder(tmp_path / "v000001", "old")
    new = folder(tmp_path / ".tmp-v000001-x", "new")
    script = "import sys, pathlib, streams.files as f; f.replace_folder(*map(pathlib.Path, sys.argv[1:]))"
    env = {**os.environ, faults.ENV: "files.folder_moved_aside"}
    done = subprocess.run([sys.executable, "-c", script, str(new), str(final)], env=env, cwd=ROOT, timeout=60)
    assert done.returncode == -signal.SIGKILL
    assert not final.exists()
    (aside,) = tmp_path.glob(".old-v000001-*")
    assert (aside / "model.safetensors").read_text() == "old" and (new / "model.safetensors").read_text() == "new"
    assert all(p.name.startswith(".") for p in tmp_path.iterdir())
