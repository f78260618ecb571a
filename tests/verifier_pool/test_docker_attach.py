"""Docker's attach stream (verifier_pool.docker_attach) without a daemon: the container's side is the other end
of a socketpair, writing frames built here from the Engine API's description of the stream format
("Attach to a container": header := [8]byte{STREAM_TYPE, 0, 0, 0, SIZE1, SIZE2, SIZE3, SIZE4}, SIZE a
big-endian uint32, then SIZE bytes of payload; STREAM_TYPE 0 stdin, 1 stdout, 2 stderr)."""

from __future__ import annotations

import asyncio
import socket
import struct
import time

import pytest

from verifier_pool import docker_attach
from verifier_pool.sandbox import SandboxUnavailable
from verifier_pool.sandbox_base import StderrTail

pytestmark = pytest.mark.timeout(30)

STDIN, STDOUT, STDERR, DAEMON_ERROR = 0, 1, 2, 3


def frame(stream: int, payload: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(payload)) + payload


@pytest.fixture
async def attached():
    """(protocol, the container's end): an AttachProtocol reading our end of a socketpair."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    protocol = await docker_attach.connect(ours, StderrTail(64))
    yield protocol, theirs
    protocol.transport.abort()
    theirs.close()


async def test_stdout_and_stderr_frames_are_told_apart(attached):
    protocol, container = attached
    container.sendall(
        frame(STDOUT, b'{"env": ')
        + frame(STDERR, b"warning: ")
        + frame(STDOUT, b"0}\n\n")
        + frame(DAEMON_ERROR, b"exec failed")
        + frame(STDIN, b"never shown")  # not a stream the daemon sends: skipped
        + frame(STDOUT, b"")
    )
    container.shutdown(socket.SHUT_WR)
    assert await protocol.stdout.read() == b'{"env": 0}\n\n'
    assert protocol.stderr.text() == "warning: exec failed"
    await asyncio.wait_for(protocol.closed.wait(), 5)


async def test_frames_cut_at_any_byte_are_read_whole():
    """The socket hands over whatever arrived: a header or a payload may be cut anywhere, frames may come
    several at once."""
    stream = frame(STDOUT, b"first ") + frame(STDERR, b"e" * 300) + frame(STDOUT, b"second") + frame(STDERR, b"!")
    for cut in range(len(stream) + 1):
        for second_cut in (cut, (cut + len(stream)) // 2):
            protocol = docker_attach.AttachProtocol(StderrTail(1000))
            for chunk in (stream[:cut], stream[cut:second_cut], stream[second_cut:]):
                if chunk:
                    protocol.data_received(chunk)
            protocol.stdout.feed_eof()
            assert await protocol.stdout.read() == b"first second", (cut, second_cut)
            assert protocol.stderr.text() == "e" * 300 + "!", (cut, second_cut)


async def test_stdin_is_written_unframed(attached):
    protocol, container = attached
    writer = docker_attach.AttachWriter(protocol)
    writer.write(b'{"cmd": "x"}\n\n')
    await writer.drain()
    assert await asyncio.to_thread(container.recv, 100) == b'{"cmd": "x"}\n\n'


async def test_the_end_of_the_containers_output_closes_the_stream_both_ways(attached):
    protocol, container = attached
    container.close()
    assert await protocol.stdout.read() == b""
    await asyncio.wait_for(protocol.closed.wait(), 5)
    writer = docker_attach.AttachWriter(protocol)
    with pytest.raises(ConnectionResetError):
        writer.write(b"late\n\n")


async def test_unread_stdout_stops_the_reading_so_a_spewing_checker_blocks_in_its_write(attached):
    """Nothing reads stdout: once 2 x STDOUT_BUFFER_BYTES are buffered the socket is no longer read, so the
    container's end cannot send the rest; reading stdout lets it through, every byte in order."""
    protocol, container = attached
    payload = bytes(range(256)) * (64 << 10)  # 16 MiB, far beyond what the socket's buffers hold
    sending = asyncio.ensure_future(asyncio.to_thread(container.sendall, frame(STDOUT, payload)))
    deadline = time.monotonic() + 10
    while protocol.transport.is_reading():
        assert time.monotonic() < deadline, "the socket was never paused"
        await asyncio.sleep(0.01)
    assert not sending.done()  # blocked in its write, not buffered here
    assert await protocol.stdout.readexactly(len(payload)) == payload
    await sending


async def test_drain_waits_until_the_container_reads_its_stdin(attached):
    protocol, container = attached
    writer = docker_attach.AttachWriter(protocol)
    request = b"x" * (16 << 20)  # more than the socket's buffers and the transport's high-water mark
    writer.write(request)
    draining = asyncio.ensure_future(writer.drain())
    done, _ = await asyncio.wait({draining}, timeout=0.2)
    assert not done  # nothing read it yet

    def read_all() -> bytes:
        received = bytearray()
        while len(received) < len(request):
            received += container.recv(1 << 20)
        return bytes(received)

    assert await asyncio.to_thread(read_all) == request
    await asyncio.wait_for(draining, 5)


class _SdkAttachment:
    """What container.attach_socket() returns on a unix socket: a wrapper with the socket as `_sock`."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_raw_socket_takes_a_nonblocking_dup_and_closes_the_sdks():
    sdk_side, container = socket.socketpair()
    attachment = _SdkAttachment(sdk_side)
    ours = docker_attach.raw_socket(attachment)
    try:
        assert attachment.closed and sdk_side.fileno() == -1
        assert ours.getblocking() is False
        container.sendall(b"still connected")
        ours.setblocking(True)
        assert ours.recv(100) == b"still connected"
    finally:
        ours.close()
        container.close()


def test_a_stream_asyncio_cannot_drive_is_unavailable():
    with pytest.raises(SandboxUnavailable, match="not TLS or ssh"):
        docker_attach.raw_socket(object())
