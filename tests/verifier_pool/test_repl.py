"""The REPL framing (verifier_pool.repl) against real processes: the fake REPL (ops/bench/synthetic_repl.py, a
test double, never evidence about Lean) and tiny scripts that write exactly the bytes a case needs."""

from __future__ import annotations

import asyncio
import json
import sys
import time

import pytest

from tests import fixtures
from verifier_pool.repl import ReplStream, encode_request
from verifier_pool.sandbox import SandboxCrashed, SandboxTimeout

pytestmark = pytest.mark.timeout(30)

FAKE_REPL = fixtures.FAKE_REPL


async def _spawn(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


@pytest.fixture
async def fake():
    """The fake REPL as a plain subprocess (no sandbox: this file tests framing only)."""
    proc = await _spawn(sys.executable, "-I", str(FAKE_REPL))
    yield proc, ReplStream(proc.stdout, proc.stdin)
    if proc.returncode is None:
        proc.kill()
    await proc.communicate()  # to EOF, so that asyncio closes the pipes before the loop does


@pytest.fixture
async def writer_script():
    """Factory: a process that ignores its input and writes `payload` (in `chunk`-byte pieces), then waits."""
    procs = []

    async def make(payload: bytes, *, chunk: int = 0, pause_s: float = 0.0) -> ReplStream:
        code = (
            "import sys, time\n"
            f"data = {payload!r}\n"
            f"step = {chunk} or len(data)\n"
            "for i in range(0, len(data), step):\n"
            "    sys.stdout.buffer.write(data[i:i + step]); sys.stdout.flush()\n"
            f"    time.sleep({pause_s})\n"
            "time.sleep(30)\n"
        )
        procs.append(await _spawn(sys.executable, "-I", "-c", code))
        return ReplStream(procs[-1].stdout, procs[-1].stdin)

    yield make
    for proc in procs:
        proc.kill()
        await proc.communicate()


def test_encode_request_is_one_escaped_line_then_a_blank_line():
    data = encode_request({"cmd": "theorem t : x := by\n  simp -- 𝓝 ≤", "env": 0})
    assert data.endswith(b"\n\n") and data.count(b"\n") == 2  # the newline inside cmd travels as \\n
    assert json.loads(data) == {"cmd": "theorem t : x := by\n  simp -- 𝓝 ≤", "env": 0}
    assert "𝓝".encode() in data  # UTF-8, not a surrogate pair


@pytest.mark.parametrize("payload", ["#print axioms t", ["cmd"], {"cmd": "\ud835"}])
def test_encode_request_refuses_what_the_repl_cannot_answer(payload):
    with pytest.raises(ValueError):
        encode_request(payload)


async def test_round_trip_multiline_responses_and_env_counter(fake):
    _, stream = fake
    assert await stream.exchange({"cmd": "import Mathlib"}, 5) == {"env": 0}
    sorry = await stream.exchange({"cmd": "def f : Nat := by sorry FIXTURE:sorry", "env": 0}, 5)
    assert sorry["env"] == 1 and sorry["sorries"][0]["goal"] == "⊢ Nat"
    assert sorry["messages"][0]["severity"] == "warning"
    error = await stream.exchange({"cmd": "FIXTURE:error", "env": 0}, 5)
    assert error["env"] == 2 and error["messages"][0]["data"].startswith("unsolved goals\n")
    assert await stream.exchange({"cmd": "x", "env": 99}, 5) == {"message": "Unknown environment."}
    assert await stream.exchange({"cmd": "x", "env": 0}, 5) == {"env": 3}


async def test_print_axioms_reports_recorded_axioms(fake):
    _, stream = fake
    await stream.exchange({"cmd": "theorem good : True := trivial"}, 5)
    await stream.exchange({"cmd": "theorem bad : False := by exact sorryAx _ -- FIXTURE:axiom=sorryAx"}, 5)
    good = await stream.exchange({"cmd": "#print axioms good", "env": 0}, 5)
    bad = await stream.exchange({"cmd": "#print axioms bad", "env": 1}, 5)
    assert good["messages"][0]["data"] == "'good' depends on axioms: [propext, Classical.choice, Quot.sound]"
    assert bad["messages"][0]["data"].endswith("Quot.sound, sorryAx]")


async def test_fake_skips_comment_queries_and_crashes_on_bad_json(fake):
    proc, stream = fake
    proc.stdin.write(b"# a comment query gets no reply\n\n")
    assert await stream.exchange({"cmd": "x"}, 5) == {"env": 0}
    proc.stdin.write(b"{not json\n\n")
    await proc.stdin.drain()
    assert await proc.wait() != 0
    assert await proc.stdout.read() == b""
    assert (await proc.stderr.read()).startswith(b"uncaught exception: ")


async def test_response_arriving_in_pieces_is_reassembled(writer_script):
    response = b'{"messages":\n [{"severity": "info",\n   "data": "a\\n\\nb"}],\n "env": 7}\n\n'
    stream = await writer_script(response, chunk=5, pause_s=0.01)
    assert (await stream.exchange({"cmd": "x"}, 10))["env"] == 7


async def test_hang_times_out_within_the_limit(fake):
    _, stream = fake
    started = time.monotonic()
    with pytest.raises(SandboxTimeout):
        await stream.exchange({"cmd": "FIXTURE:hang"}, 0.5)
    assert time.monotonic() - started < 0.5 + 0.3


@pytest.mark.parametrize("cmd", ["FIXTURE:crash", "FIXTURE:garbage"])
async def test_eof_and_garbage_are_crashes(fake, cmd):
    _, stream = fake
    with pytest.raises(SandboxCrashed):
        await stream.exchange({"cmd": cmd}, 5)


async def test_bytes_after_the_response_are_a_crash(writer_script):
    stream = await writer_script(b'{"env": 0}\n\n{"env": 1}\n\n')
    with pytest.raises(SandboxCrashed, match="after its response"):
        await stream.exchange({"cmd": "x"}, 5)


async def test_oversized_response_fails_without_reading_it_all(fake):
    proc, stream = fake
    started = time.monotonic()
    with pytest.raises(SandboxCrashed, match="exceeds"):
        await stream.exchange({"cmd": "FIXTURE:bigout"}, 10)
    assert time.monotonic() - started < 3
    assert proc.returncode is None  # still blocked writing: most of its 10 MB was never read
    assert len(proc.stdout._buffer) < 4 << 20  # what asyncio holds is bounded by its flow control


# -- the exchange's timer counts the worker's awake time ------------------------------------------------------
# A stall is played by blocking the event loop with time.sleep: to the loop that is what SIGSTOP, swapping or a
# long GC pause look like (no callback runs, the clock moves on), while the checker, another process, goes on.


class _NotingWriter:
    """The checker's stdin, noting when a request has been handed to the pipe, so a test stalls after it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.wrote = asyncio.Event()

    def write(self, data: bytes) -> None:
        self.inner.write(data)  # asyncio writes to an empty pipe at once, in this call
        self.wrote.set()

    async def drain(self) -> None:
        await self.inner.drain()


async def _warm_stream(proc) -> tuple[ReplStream, _NotingWriter]:
    writer = _NotingWriter(proc.stdin)
    stream = ReplStream(proc.stdout, writer)
    assert await stream.exchange({"cmd": "warm"}, 10) == {"env": 0}  # the fake is up and reading
    writer.wrote.clear()
    return stream, writer


async def test_a_reply_that_arrived_while_the_worker_was_stalled_wins_over_the_late_timer(fake):
    proc, _ = fake
    stream, writer = await _warm_stream(proc)
    task = asyncio.create_task(stream.exchange({"cmd": "FIXTURE:slow=0.3"}, 1.0))
    await writer.wrote.wait()
    time.sleep(2.5)  # the stall, past the timeout; the checker answers 0.3 s into it
    assert await task == {"env": 1}


async def test_a_reply_that_arrived_in_a_stall_that_began_at_the_end_of_the_budget_still_wins(fake):
    """Charged 0.85 s of a 1 s budget when the stall begins; the reply comes during the stall. The reading
    that ends the stall must not be the one that declares the timeout."""
    proc, _ = fake
    stream, writer = await _warm_stream(proc)
    task = asyncio.create_task(stream.exchange({"cmd": "FIXTURE:slow=0.95"}, 1.0))
    await writer.wrote.wait()
    await asyncio.sleep(0.85)  # awake: charged to the check
    time.sleep(2.0)
    assert await task == {"env": 1}


async def test_a_hang_still_times_out_after_a_stall_which_is_not_charged_to_it(fake):
    proc, _ = fake
    stream, writer = await _warm_stream(proc)
    started = time.monotonic()
    task = asyncio.create_task(stream.exchange({"cmd": "FIXTURE:hang"}, 1.0))
    await writer.wrote.wait()
    time.sleep(1.5)
    with pytest.raises(SandboxTimeout, match="stalled"):
        await task
    # At most one tick (0.25 s) of the budget went by before the stall; the rest is awake time after it.
    assert 1.5 + 0.7 <= time.monotonic() - started < 1.5 + 1.0 + 3.0
