"""Docker's attach stream, driven from asyncio: how the docker sandbox backend talks to its checker's stdio.

A container created with stdin open and no TTY and attached with stream=1 (stdin, stdout, stderr) gives one
socket. What we write to it is the container's stdin, as is. What we read is stdout and stderr multiplexed in
frames (Docker Engine API, "Attach to a container", stream format): an 8-byte header, the stream (1 stdout,
2 stderr; 3 is the daemon's own error, API >= 1.42), three zero bytes and the payload's length as a
big-endian uint32, then the payload. `AttachProtocol` demultiplexes: stdout into an asyncio.StreamReader
that verifier_pool.repl.ReplStream reads, with flow control (the socket stops being read while too much
stdout is unread, so a checker that spews output is blocked in its write(), not buffered here), stderr and
the daemon's errors into a bounded tail for crash messages. `AttachWriter` is the stdin side ReplStream
writes to. stdin only ever carries JSON (json.dumps escapes every control character), so the daemon's
detach keys (ctrl-p ctrl-q) cannot occur in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket

from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_base import StderrTail

STDOUT_BUFFER_BYTES = 256 * 1024  # unread stdout above 2x this pauses reading the socket (StreamReader's rule)
_HEADER_BYTES = 8
_STDOUT, _STDERR, _DAEMON_ERROR = 1, 2, 3


class AttachProtocol(asyncio.Protocol):
    """Demultiplexes the attach stream: stdout into `stdout`, stderr into a bounded tail."""

    def __init__(self, stderr: StderrTail) -> None:
        self.stdout = asyncio.StreamReader(limit=STDOUT_BUFFER_BYTES)
        self.stderr = stderr
        self.closed = asyncio.Event()
        self.transport: asyncio.Transport | None = None
        self._header = bytearray()
        self._stream = 0
        self._left = 0  # payload bytes of the current frame still to come
        self._writable = asyncio.Event()
        self._writable.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.stdout.set_transport(transport)  # StreamReader pauses/resumes reading on its buffer's size

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            if self._left == 0:
                need = _HEADER_BYTES - len(self._header)
                self._header += view[:need]
                view = view[need:]
                if len(self._header) < _HEADER_BYTES:
                    return
                self._stream = self._header[0]
                self._left = int.from_bytes(self._header[4:8], "big")
                self._header.clear()
                continue
            chunk, view = view[: self._left], view[self._left :]
            self._left -= len(chunk)
            if self._stream == _STDOUT:
                self.stdout.feed_data(bytes(chunk))
            elif self._stream in (_STDERR, _DAEMON_ERROR):
                self.stderr.feed(chunk)

    def eof_received(self) -> bool:
        return False  # the container's output ended: close the connection

    def connection_lost(self, exc: Exception | None) -> None:
        self.stdout.feed_eof()
        self.closed.set()
        self._writable.set()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    async def writable(self) -> None:
        await self._writable.wait()


class AttachWriter:
    """stdin of the container: write() and drain(), as ReplStream wants them."""

    def __init__(self, protocol: AttachProtocol) -> None:
        self._protocol = protocol

    def write(self, data: bytes) -> None:
        if self._protocol.closed.is_set() or self._protocol.transport is None:
            raise ConnectionResetError("the container's stdio stream is closed")
        self._protocol.transport.write(data)

    async def drain(self) -> None:
        await self._protocol.writable()
        if self._protocol.closed.is_set():
            raise ConnectionResetError("the container's stdio stream is closed")


async def connect(sock: socket.socket, stderr: StderrTail) -> AttachProtocol:
    """An AttachProtocol on `sock` (non-blocking, ours to close), reading from now on."""
    protocol = AttachProtocol(stderr)
    try:
        await asyncio.get_running_loop().create_connection(lambda: protocol, sock=sock)
    except BaseException:
        sock.close()
        raise
    return protocol


def raw_socket(attached) -> socket.socket:
    """A socket of our own on the SDK's attach connection (container.attach_socket's result): a non-blocking
    dup of the SDK's, whose wrappers are then closed."""
    import ssl  # noqa: PLC0415

    raw = getattr(attached, "_sock", attached)
    if isinstance(raw, ssl.SSLSocket) or not isinstance(raw, socket.socket):
        raise SandboxUnavailable(
            f"cannot drive a {type(raw).__name__} attach stream from asyncio: use a unix socket or plain tcp "
            "DOCKER_HOST (not TLS or ssh)"
        )
    ours = raw.dup()
    with contextlib.suppress(Exception):
        attached.close()
    with contextlib.suppress(Exception):
        raw.close()  # the connection stays up: `ours` still refers to it
    ours.setblocking(False)
    return ours
