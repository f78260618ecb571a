"""The Lean REPL's wire framing over asyncio streams (docs/brief/LEAN_REPL.md, "REPL framing").

A request is one JSON object on one line followed by a blank line; a response is pretty-printed JSON that
never contains an empty line, followed by one empty line. This module only frames and parses; what the
response means (verdicts) and what to do with a broken sandbox (kill, restart) belong to the callers.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout, SandboxUnavailable

T = TypeVar("T")

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20  # a REPL answer to one proof is a few KB; 1 MiB is already abuse
_READ_CHUNK_BYTES = 64 * 1024
_TERMINATOR = b"\n\n"  # the end of the response's last line, then the empty line
# The exchange's timer (`awake_timeout`) reads the clock at least this often; a reading that comes this much
# later than asked means the worker was not running in between (stopped, swapped out, a long GC pause).
_TICK_S = 0.25
STALL_TOLERANCE_S = 0.25


@dataclass(frozen=True, slots=True)
class Handshake:
    """A request a healthy checker answers at once without doing any work, and what its answer must hold.

    A sandbox counts as started only once its checker answered this (DESIGN.md, "Verdicts"): a missing or
    unreadable interpreter, a bad uid or a broken image then fails start() (infrastructure, SandboxUnavailable)
    instead of crashing every request, which would be blamed on the proofs."""

    request: Mapping[str, Any]
    expect: Mapping[str, Any]  # items the reply must contain
    hint: str = ""  # what to do when the reply is not the expected one

    def accepts(self, reply: Mapping[str, Any]) -> bool:
        return all(reply.get(k) == v for k, v in self.expect.items())


# The Lean REPL answers a command naming an unknown env before elaborating anything (REPL/Main.lean,
# `runCommand`: `if notFound then return .inr ⟨"Unknown environment."⟩`), so this costs no Lean work and
# no env id. The synthetic REPL (ops/bench/synthetic_repl.py) answers it the same way.
LEAN_HANDSHAKE = Handshake({"cmd": "", "env": 2**31 - 1}, {"message": "Unknown environment."})


async def handshake(stream: ReplStream, hs: Handshake, timeout_s: float) -> dict[str, Any]:
    """Ask `hs` on a freshly started checker; its reply, or SandboxUnavailable saying why it is not one."""
    try:
        reply = await stream.exchange(dict(hs.request), timeout_s)
    except (SandboxTimeout, SandboxCrashed) as e:
        raise SandboxUnavailable(f"the checker did not answer its handshake: {e}") from e
    if not hs.accepts(reply):
        hint = f": {hs.hint}" if hs.hint else ""
        raise SandboxUnavailable(
            f"the checker answered its handshake with {str(reply)[:200]}, expected {dict(hs.expect)}{hint}"
        )
    return reply


class _Writer(Protocol):
    def write(self, data: bytes) -> Any: ...

    async def drain(self) -> None: ...


def encode_request(payload: dict[str, Any]) -> bytes:
    """`payload` as the REPL reads it: one JSON line, then the blank line that ends the query.

    json.dumps escapes every control character, so a newline inside `cmd` travels as `\\n` (a raw newline
    would be deleted by the REPL's line joining: `by\\nsorry` would become `bysorry`). Non-ASCII is sent as
    UTF-8 rather than `\\uXXXX`: characters outside the BMP (Mathlib's 𝓝) would need surrogate pairs, which
    we have no evidence Lean's JSON parser recombines. A str with lone surrogates cannot be encoded and
    raises UnicodeEncodeError (a ValueError) before anything is sent.
    """
    if not isinstance(payload, dict):
        # The REPL skips, without replying, a query that starts with `#` or `--` (its test-file comments).
        # A serialized dict starts with `{`, so only a non-dict payload could hang the exchange that way.
        raise ValueError(f"a REPL request is a JSON object, not {type(payload).__name__}")
    return json.dumps(payload, ensure_ascii=False).encode("utf-8") + _TERMINATOR


class ReplStream:
    """One request/response exchange at a time with a checker speaking the REPL framing.

    After any SandboxError the stream is out of step with the checker (a late reply would be taken for the
    next request's): the caller must kill the checker and build a new stream, never retry on this one.
    """

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: _Writer,
        *,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self._max_response_bytes = max_response_bytes

    async def exchange(self, payload: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send `payload`, return the parsed response. SandboxTimeout when no complete response arrives
        within `timeout_s` of this worker's awake time (writing included; time the worker was stalled is not
        the proof's: `awake_timeout`); SandboxCrashed on EOF, garbage or an oversized response."""
        data = encode_request(payload)
        return _parse(await awake_timeout(self._send_and_read(data), timeout_s))

    async def _send_and_read(self, data: bytes) -> bytes:
        try:
            self._writer.write(data)
            await self._writer.drain()
        except (BrokenPipeError, ConnectionResetError) as e:
            raise SandboxCrashed(f"checker closed its input: {e}") from e
        return await self._read_response()

    async def _read_response(self) -> bytes:
        buffer = bytearray()
        searched = 0  # bytes already known to hold no terminator, so each chunk is scanned once
        while True:
            end = buffer.find(_TERMINATOR, max(0, searched - 1))
            if end >= 0:
                if end + len(_TERMINATOR) != len(buffer):
                    # Nothing may follow the empty line: the checker answers one request with one response.
                    raise SandboxCrashed(f"checker wrote {len(buffer) - end - 2} bytes after its response")
                return bytes(buffer[:end])
            searched = len(buffer)
            if len(buffer) > self._max_response_bytes:
                # Stop here: the rest is never read, so a 10 MB answer costs at most this buffer.
                raise SandboxCrashed(f"response exceeds {self._max_response_bytes} bytes")
            chunk = await self._reader.read(_READ_CHUNK_BYTES)
            if not chunk:
                tail = bytes(buffer[-200:]).decode("utf-8", "replace")
                raise SandboxCrashed(f"checker closed its output (EOF) after {len(buffer)} bytes: {tail!r}")
            buffer += chunk


async def awake_timeout(aw: Awaitable[T], timeout_s: float) -> T:
    """`aw`'s result, or SandboxTimeout once it has run for `timeout_s` of the time this process was awake.

    A plain timer counts wall-clock time, so a worker stopped mid-check (SIGSTOP, swapped out, a long GC
    pause) wakes to a timer that fired while it slept, and would score the proof `timeout` though the proof
    never used its time: the checker runs in another process and has often answered into the pipe meanwhile.
    Here the clock is read every `_TICK_S`; a reading that comes more than `STALL_TOLERANCE_S` later than
    asked is a stall, and the excess is not charged to the check. Nor is a timeout ever declared on the
    reading that ends a stall: the loop first takes one more turn, so a reply that arrived while the worker
    slept is read and wins. The checker gets at least `timeout_s` of the worker's awake time, more only by
    the stalls; a proof that really loops still ends in SandboxTimeout once its budget is spent.
    """
    task = asyncio.ensure_future(aw)
    charged_s = stalled_s = 0.0
    last = time.monotonic()
    try:
        while True:
            asked_s = max(min(_TICK_S, timeout_s - charged_s), 0.0)
            await asyncio.wait((task,), timeout=asked_s)
            if task.done():
                return task.result()
            now = time.monotonic()
            late_s = (now - last) - asked_s
            last = now
            if late_s > STALL_TOLERANCE_S:
                stalled_s += late_s
                charged_s += asked_s
                continue  # not on this reading: the reply may be in the pipe, unread
            charged_s += asked_s + max(late_s, 0.0)
            if charged_s >= timeout_s:
                stalled = f" (and {stalled_s:.1f} s more while the worker was stalled)" if stalled_s else ""
                raise SandboxTimeout(f"no complete response within {timeout_s:g} s{stalled}")
    finally:
        if not task.done():
            task.cancel()
            # Let the cancellation land before returning: the caller kills the checker next, and no read may
            # be left pending on a stream it no longer owns.
            await asyncio.wait((task,))


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        response = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        head = raw[:200].decode("utf-8", "replace")
        raise SandboxCrashed(f"unparsable response ({e}): {head!r}") from e
    if not isinstance(response, dict):
        raise SandboxCrashed(f"response is not a JSON object: {type(response).__name__}")
    return response
