"""A redis-py retry policy for a client that must live through a Redis restart: arq's pool in a worker.

redis-py retries a command through the `Retry` of its connection (redis/asyncio/client.py, `execute_command`
and `Pipeline.execute`: `conn.retry.call_with_retry`), reconnecting in between, for the errors the client was
told to retry (`retry_on_error`); connecting goes through the same policy (redis/asyncio/connection.py,
`connect`). A `Retry` gives up after a count; a worker waiting for its Redis should give up on a state instead:

- `starting` (the initial state): never retry. arq's start has its own patience (`create_pool`: conn_retries
  tries, conn_retry_delay apart, each logged), and a wrong URL should fail the start, not hang it.
- `riding out` (`ride_out()`, once the worker is up): retry for as long as it takes, with capped exponential
  backoff, so an outage of any length (a restart, a reload of the AOF, a failover) ends in the same process.
- `stopping` (`stop_within(grace_s)`): retry until the grace ends, then raise, so that a shutdown with Redis
  down ends in bounded time. Calls already waiting see the change: the state is read at each failure.

redis-py deep-copies the policy into every client and connection (client.py `Redis.__init__`, connection.py
`AbstractConnection.__init__`); `__deepcopy__` returns the policy itself, so the state is the process's.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog
from redis import exceptions as rx
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

log = structlog.get_logger("streams.ride_out")

# What "Redis is not there now" looks like to a client, as streams.runtime classifies it: refused or reset
# connections (redis-py raises ConnectionError, and a bare OSError from inside `connect`'s own retry), a server
# still loading its AOF (BusyLoadingError, a ConnectionError), timeouts, a server out of memory that refuses
# writes, and a replica after a failover.
UNAVAILABLE: tuple[type[Exception], ...] = (
    rx.ConnectionError,
    rx.TimeoutError,
    OSError,
    rx.OutOfMemoryError,
    rx.ReadOnlyError,
)

T = TypeVar("T")
_LOG_EVERY = 15  # failures of one call between two log lines: about every 30 s at the 2 s cap


class RideOut(Retry):
    def __init__(self, *, client: str, cap_s: float = 2.0, base_s: float = 0.05) -> None:
        super().__init__(ExponentialBackoff(cap=cap_s, base=base_s), retries=-1, supported_errors=UNAVAILABLE)
        self.client = client  # names the client in the log lines
        self.give_up_at = 0.0  # time.monotonic() after which a failure is raised: 0 starting, inf riding out

    def __deepcopy__(self, memo: dict) -> RideOut:
        return self  # one state for the pool and every connection (module docstring)

    def start_within(self, patience_s: float) -> None:
        """Starting with a client arq did not build (workers.py, a sentinel URL): its patience, ours to give."""
        self.give_up_at = time.monotonic() + patience_s

    def ride_out(self) -> None:
        self.give_up_at = math.inf

    def stop_within(self, grace_s: float) -> None:
        self.give_up_at = min(self.give_up_at, time.monotonic() + grace_s)

    async def call_with_retry(self, do: Callable[[], Awaitable[T]], fail: Callable[[Exception], Awaitable]) -> T:
        failures = 0
        while True:
            try:
                return await do()
            except self._supported_errors as error:
                failures += 1
                await fail(error)  # disconnects; raises at once what the client was not told to retry
                left_s = self.give_up_at - time.monotonic()
                if left_s <= 0:
                    raise
                if failures % _LOG_EVERY == 1:
                    log.warning("redis_unavailable", client=self.client, error=str(error), failures=failures)
                # ExponentialBackoff is a pure function of the count (no state to share between callers).
                await asyncio.sleep(min(self._backoff.compute(failures), left_s))
