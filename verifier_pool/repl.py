"""The Lean REPL's wire framing over asyncio streams (../shared/LEAN_REPL.md, "REPL framing").

A request is one JSON object on one line followed by a blank line; a response is pretty-printed JSON that
never contains an empty line, followed by one empty line. This module only frames and parses; what the
response means (verdicts) and what to do with a broken sandbox (kill, restart) belong to the callers.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Protocol

from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout

DEFAULT_MAX_RESPONSE_BYTES = 1 << 20  # a REPL answer to one proof is a few KB; 1 MiB is already abuse
_READ_CHUNK_BYTES = 64 * 1024
_TERMINATOR = b"\n\n"  # the end of the response's last line, then the empty line


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
        within `timeout_s` (writing included); SandboxCrashed on EOF, garbage or an oversized response."""
        data = encode_request(payload)
        try:
            async with asyncio.timeout(timeout_s):
                try:
                    self._writer.write(data)
                    await self._writer.drain()
                except (BrokenPipeError, ConnectionResetError) as e:
                    raise SandboxCrashed(f"checker closed its input: {e}") from e
                raw = await self._read_response()
        except TimeoutError as e:
            raise SandboxTimeout(f"no complete response within {timeout_s:g} s") from e
        return _parse(raw)

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


def _parse(raw: bytes) -> dict[str, Any]:
    try:
        response = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        head = raw[:200].decode("utf-8", "replace")
        raise SandboxCrashed(f"unparsable response ({e}): {head!r}") from e
    if not isinstance(response, dict):
        raise SandboxCrashed(f"response is not a JSON object: {type(response).__name__}")
    return response
