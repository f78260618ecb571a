"""The sandbox interface: one warm, isolated checker process (a Lean REPL, or the Countdown checker) that
answers JSON requests over its stdio, whatever isolates it (Docker, bubblewrap/unshare, a remote server).

Outcomes are classified here, where they happen:
- `SandboxTimeout`: the request ran past its time limit. The sandbox has been killed (the whole process
  group or container) and must be restarted. Whether that is the proof's fault (verdict `timeout`) or the
  infrastructure's is the caller's call: a request that never got a reply within the limit is the proof's.
- `SandboxCrashed`: the process died, closed its output, or wrote garbage / too much. Retried once on a
  fresh sandbox by the caller; a proof that crashes every sandbox is the proof's fault.
- `SandboxUnavailable`: the sandbox could not be started at all (no image, no bwrap, daemon down). The
  infrastructure's fault: the attempt stays pending, never a reward of 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class SandboxError(Exception):
    """Base of the sandbox's own failures (never raised for a proof that is merely wrong)."""


class SandboxTimeout(SandboxError):
    pass


class SandboxCrashed(SandboxError):
    pass


class SandboxUnavailable(SandboxError):
    pass


@dataclass
class SandboxStats:
    sandbox_id: str
    backend: str
    requests: int = 0  # requests answered since the last (re)start
    total_requests: int = 0
    starts: int = 0
    timeouts: int = 0
    crashes: int = 0
    memory_bytes: int | None = None  # the checker's memory at the recycle threshold's last reading, if any
    extra: dict[str, Any] = field(default_factory=dict)


class Sandbox(Protocol):
    """One checker process. Not safe for concurrent use: a consumer task owns exactly one."""

    sandbox_id: str
    backend: str
    # What judges, for the verdict cache key (consumers.verifier.verdict_digest): the image id (docker), the
    # checker's digest from its handshake or the toolchain's (process). "" until the first start.
    identity: str

    async def start(self) -> None:
        """Start the checker and return once it answered its handshake (verifier_pool.repl.Handshake); a
        checker that cannot start or does not answer raises SandboxUnavailable. The warm-up (e.g. `import
        Mathlib` elaborated once) is done by the caller's first request, not here."""

    async def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send one JSON request and return the JSON response. Raises SandboxTimeout / SandboxCrashed."""

    async def kill(self) -> None:
        """Stop the checker for good: the process group or the container, never just a client."""

    async def take_file(self, path: str, max_bytes: int) -> bytes:
        """Read and remove a regular file directly under the checker's /tmp: untrusted bytes, at most
        `max_bytes` (the Lean REPL's pickle for verifier_pool.lean_audit). OSError if absent or not a regular
        file, ValueError if larger, SandboxUnavailable if no checker runs."""

    def stats(self) -> SandboxStats: ...
