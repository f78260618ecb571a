"""Fault injection for the recovery tests: a process that SIGKILLs itself at a named point.

`PROOFSTREAM_KILL_AT=<point>[:<n>]` makes the process kill itself with SIGKILL the n-th time (default: the
first) it passes `point(<point>)`, exactly as `kill -9` would at that instant: no cleanup, no `finally`, no
flush. Without the variable a point costs one dictionary lookup. The points are where a kill is worth
testing and hard to hit from outside (between the steps of a checkpoint): see `grep -rn "faults.point"`.
"""

from __future__ import annotations

import os
import signal

ENV = "PROOFSTREAM_KILL_AT"
_passes: dict[str, int] = {}


def point(name: str) -> None:
    """Die here if `PROOFSTREAM_KILL_AT` names this point and this is its n-th pass."""
    target = os.environ.get(ENV)
    if not target:
        return
    where, _, nth = target.partition(":")
    if where != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
