"""What the docker and process backends do alike: a checker started behind a handshake and driven over its
stdio with the REPL framing (verifier_pool.repl), one request at a time.

`StdioSandbox.request` is the one request path: (re)start when the checker is gone or was cut off
mid-exchange (a cancelled request: its late reply would be taken for the next one's), or when a backend that
recycles lazily says so (`_needs_restart`: docker); exchange with the time limit; classify. A timeout or a
crash is counted, logged and followed by the backend's `_discard` (the whole container or process tree is
killed: never a retry on a stream out of step); a crash's message gets the checker's exit status and stderr
tail. A payload refused before anything was sent (ValueError) leaves the checker in step.

After an answer (`_answered`) the checker is recycled once it gave `max_requests` answers or its memory
passed `max_memory_bytes`, that memory read at most every `memory_check_interval_s` (SandboxConfig);
the backend's `_recycle` replaces it at once (process) or on the next request (docker).

A backend owns how its checker is isolated, started and killed (`start`, `kill`, `_discard`, `_recycle`),
how its memory is read (`_memory_reading`), `take_file`, and how to tell that its checker runs (`_running`,
`_stdout_at_eof`, `_exit_status`).
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from typing import Any, ClassVar, Generic, TypeVar

from verifier_pool.repl import ReplStream
from verifier_pool.sandbox import SandboxCrashed, SandboxStats, SandboxTimeout
from verifier_pool.sandbox_config import SandboxConfig

EXIT_GRACE_S = 1.0  # after EOF on stdout, how long a crashing checker gets to exit and finish its stderr

Config = TypeVar("Config", bound=SandboxConfig)


class StderrTail:
    """The last `keep` bytes a checker wrote to its stderr (the interesting line of a crash comes last)."""

    def __init__(self, keep: int) -> None:
        self._keep = keep
        self._tail = bytearray()

    def feed(self, data: bytes | memoryview) -> None:
        self._tail += data
        del self._tail[: -self._keep]

    def text(self) -> str:
        return self._tail.decode("utf-8", "replace")


class StdioSandbox(Generic[Config]):
    """The Sandbox protocol's shared half (the module's docstring); a backend subclasses it."""

    backend: ClassVar[str]
    _log: ClassVar[Any]  # the backend's structlog logger

    def __init__(self, config: Config, sandbox_id: str | None = None) -> None:
        self.config = config
        self.sandbox_id = sandbox_id or f"{self.backend}-{uuid.uuid4().hex[:8]}"
        self.identity = ""  # set by each start that the checker answered; "" while none has
        self._stats = SandboxStats(sandbox_id=self.sandbox_id, backend=self.backend)
        self._stream: ReplStream | None = None
        self._stderr = StderrTail(config.stderr_tail_bytes)
        self._in_flight = False  # still True after an exchange that never finished (cancelled): out of step
        self._memory_read_at = -math.inf  # time.monotonic() of the recycle threshold's last reading

    # -- the Sandbox protocol --------------------------------------------------------------------------

    async def start(self) -> None:
        raise NotImplementedError

    async def kill(self) -> None:
        raise NotImplementedError

    async def request(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if self._needs_restart():
            await self.start()
        stream = self._stream
        assert stream is not None
        self._in_flight = True
        try:
            response = await self._exchange(stream, payload, timeout_s)
        except ValueError:
            self._in_flight = False  # refused before anything was sent: the checker is still in step
            raise
        except SandboxTimeout:
            self._stats.timeouts += 1
            self._log.warning("sandbox_timeout", sandbox=self.sandbox_id, timeout_s=timeout_s)
            await self._discard()
            raise
        except SandboxCrashed as e:
            self._stats.crashes += 1
            detail = await self._exit_detail(wait_s=EXIT_GRACE_S if self._stdout_at_eof() else 0)
            self._log.warning("sandbox_crashed", sandbox=self.sandbox_id, error=str(e), detail=detail)
            await self._discard()
            raise SandboxCrashed(f"{e} ({detail})") from e
        self._in_flight = False
        self._stats.requests += 1
        self._stats.total_requests += 1
        await self._answered()
        return response

    def stats(self) -> SandboxStats:
        return dataclasses.replace(self._stats, extra=dict(self._stats.extra))

    @property
    def stderr_tail(self) -> str:
        """What the last checker wrote to its stderr, its last `stderr_tail_bytes`."""
        return self._stderr.text()

    # -- for the backends ------------------------------------------------------------------------------

    def _fresh_stderr(self) -> StderrTail:
        """An empty stderr tail for the checker being started (the last one's stays readable until then)."""
        self._stderr = StderrTail(self.config.stderr_tail_bytes)
        return self._stderr

    def _started(self, started: float, identity: str, **log_fields: Any) -> None:
        """Bookkeeping of a start whose checker answered its handshake; `started` is its time.monotonic()."""
        self.identity = identity
        self._in_flight = False
        self._stats.requests = 0
        self._stats.starts += 1
        self._memory_read_at = -math.inf  # a new checker's first answer is read
        self._log.info("sandbox_started", sandbox=self.sandbox_id, **log_fields, start_ms=ms_since(started))

    def _needs_restart(self) -> bool:
        """Before a request: no checker runs, or the last exchange was cut off (cancelled)."""
        return not self._running() or self._in_flight

    async def _answered(self) -> None:
        """After each answer: recycle the checker once it gave `max_requests` answers or its memory passed
        `max_memory_bytes`."""
        max_requests = self.config.max_requests
        if max_requests is not None and self._stats.requests >= max_requests:
            reason = "requests"
        elif await self._memory_passed():
            reason = "memory"
        else:
            return
        stats = self._stats
        self._log.info(
            "sandbox_recycle",
            sandbox=self.sandbox_id,
            reason=reason,
            requests=stats.requests,
            memory_bytes=stats.memory_bytes,
        )
        await self._recycle()

    async def _memory_passed(self) -> bool:
        """Whether the checker's memory passed `max_memory_bytes`: read at most every `memory_check_interval_s`
        (a reading costs as much as a Countdown check), and no more after a reading the backend could not make
        at once."""
        limit = self.config.max_memory_bytes
        now = time.monotonic()
        if limit is None or now - self._memory_read_at < self.config.memory_check_interval_s:
            return False
        self._memory_read_at = now
        used = await self._memory_reading()
        if used is None:
            return False
        self._stats.memory_bytes = used
        return used > limit

    async def _exchange(self, stream: ReplStream, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """One exchange; a backend may watch it (the process backend's memory watchdog)."""
        return await stream.exchange(payload, timeout_s)

    async def _discard(self) -> None:
        """After a timeout or a crash: kill the whole checker (its stream is out of step)."""
        raise NotImplementedError

    async def _recycle(self) -> None:
        """After an answer that spent the checker (`_answered`): replace it, now or before the next request."""
        raise NotImplementedError

    async def _memory_reading(self) -> int | None:
        """The checker's memory for the recycle threshold, or None where it cannot be read at once."""
        raise NotImplementedError

    async def _exit_detail(self, wait_s: float) -> str:
        """Exit status and stderr tail, for the error message. A crashing checker is given `wait_s` to exit
        and finish its stderr (the interesting line, e.g. `Stack overflow detected`, comes last)."""
        status = await self._exit_status(wait_s)
        if status is None:
            return "not running"
        return f"{status}; stderr tail: {self.stderr_tail[-1000:]!r}"

    def _running(self) -> bool:
        raise NotImplementedError

    def _stdout_at_eof(self) -> bool:
        raise NotImplementedError

    async def _exit_status(self, wait_s: float) -> str | None:
        """The checker's exit status ("exit status N", and why where known), or "still running" once `wait_s`
        passed without its exit; None when no checker was started."""
        raise NotImplementedError


def ms_since(started: float) -> int:
    return round((time.monotonic() - started) * 1000)
