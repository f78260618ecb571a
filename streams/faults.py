"""Fault injection for the recovery tests: a process that SIGKILLs itself, or fails, at a named point.

`PROOFSTREAM_KILL_AT=<point>[:<n>]` makes the process kill itself with SIGKILL the n-th time (default: the
first) it passes `point(<point>)`, exactly as `kill -9` would at that instant: no cleanup, no `finally`, no
flush. `PROOFSTREAM_FAIL_AT=<point>` makes every pass of `point(<point>)` raise `InjectedFault` (a
RuntimeError), as a component broken for good would (an engine that fails every call). Without the
variables a point costs two dictionary lookups. The points are where a fault is worth testing and hard to
cause from outside: see `grep -rn "faults.point"`.
"""

from __future__ import annotations

import os
import signal

ENV = "PROOFSTREAM_KILL_AT"
FAIL_ENV = "PROOFSTREAM_FAIL_AT"
_passes: dict[str, int] = {}


class InjectedFault(RuntimeError):
    """Raised where `PROOFSTREAM_FAIL_AT` names the point."""


def point(name: str) -> None:
    """Die here if `PROOFSTREAM_KILL_AT` names this point and this is its n-th pass; raise if
    `PROOFSTREAM_FAIL_AT` names it."""
    if os.environ.get(FAIL_ENV) == name:
        raise InjectedFault(f"fault injected at {name} ({FAIL_ENV})")
    target = os.environ.get(ENV)
    if not target:
        return
    where, _, nth = target.partition(":")
    if where != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    if _passes[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
