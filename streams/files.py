"""Files that appear whole: write under a temporary name beside the target, fsync it, rename it over the
target, fsync the folder. A reader, or a process restarted after a kill at any instant, sees the old file or
the new one, never a part of one. A kill before the rename leaves the temporary `.<name>.<random>` file
behind; a writer that can be killed mid-write removes such files at its start (trainer.grpo).

Folders appear whole too (`replace_folder`), with one difference: a folder cannot be renamed over a folder,
so the old one is moved aside first, and for the instant between the two renames there is none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from streams import faults


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary path beside `path` for the body to write; on a clean exit it replaces `path` (durably),
    on an exception it is removed and `path` is left as it was."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_bytes(path: Path, data: bytes) -> None:
    """`path` holds exactly `data` afterwards, or what it held before if this was cut short."""
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def replace_folder(new: Path, final: Path) -> None:
    """Put the folder `new` (complete, its files fsynced, beside `final`) in `final`'s place, durably.

    An existing `final` is renamed aside to `.old-<name>-<pid>-<ns>`, `new` renamed into place, the old one
    removed. A reader sees the old folder or the new one, never a mix; a kill between the two renames leaves
    no `final` at all, the old folder under its `.old-` name and the new one under its own (dot) name: a
    writer that can be killed removes such folders at its start (trainer.grpo), and what named `final` is
    written again or taken from an older one (a policy version, a checkpoint).
    """
    if final.exists():
        old = final.parent / f".old-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
        os.rename(final, old)
        faults.point("files.folder_moved_aside")
        os.rename(new, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(new, final)
    fsync_dir(final.parent)


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
