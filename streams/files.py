"""Files that appear whole: write under a temporary name beside the target, fsync it, rename it over the
target, fsync the folder. A reader, or a process restarted after a kill at any instant, sees the old file or
the new one, never a part of one. A kill before the rename leaves the temporary `.<name>.<random>` file
behind; a writer that can be killed mid-write removes such files at its start (trainer.grpo).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


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


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in `folder` durable (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
