"""What a person reads on the trainer's stderr (trainer/console.py): a bar and log lines never share a line, on
a terminal (a real pseudo-terminal, its output replayed as a terminal draws it) or not (a pipe); the ETA
counts the final evaluation; an evaluation's line when it lands."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from trainer.console import Console

ROOT = Path(__file__).resolve().parents[2]

# A run's console as the trainer drives it, with structlog configured as every role configures it and a plain
# print between: versions 0..3 of 3, an evaluation landing, log records between them, the end.
CHILD = """
import sys
import structlog
from streams import logs
from trainer.console import Console

logs.configure()
log = structlog.get_logger("trainer.loop")
console = Console(3)
console(0)
log.info("es_update", version=0, reward_mean=0.1)
console.evaluated("held-out v0: reward 0.100, 0/8 solved", 2.0)
console(1)
log.info("es_update", version=1, reward_mean=0.2)
print("trainer: a line printed to stderr", file=sys.stderr)
console(2)
log.warning("order_lost", work_id="es-v2-m0")
console(3)
console.evaluated("held-out v3: reward 0.250, 1/8 solved (+0.150 vs v0)", 2.0)
console(None)
print("trainer: the end line", file=sys.stderr)
"""


def _child(stderr) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD], cwd=ROOT, stderr=stderr, stdout=subprocess.DEVNULL)


def _is_log_record(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except json.JSONDecodeError:
        return False


def test_not_on_a_terminal_each_version_is_a_plain_line_and_no_line_holds_two_things():
    proc = _child(subprocess.PIPE)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    lines = err.decode().split("\n")[:-1]
    assert "\r" not in err.decode() and "|" not in err.decode()  # no bar drawn
    for line in lines:  # each line one thing: a JSON record, or one of the trainer's own lines
        assert _is_log_record(line) != line.startswith("trainer: "), line
    own = [line for line in lines if line.startswith("trainer: ")]
    assert own[0] == "trainer: version 0 of 3; ETA after the first version"
    assert own[1] == "trainer: held-out v0: reward 0.100, 0/8 solved"
    assert own[2].startswith("trainer: version 1 of 3 after ") and "with the final evaluation" in own[2]
    assert own[5].startswith("trainer: version 3 of 3 after ") and own[5].endswith("the final evaluation, about 2 s")
    assert own[6:] == ["trainer: held-out v3: reward 0.250, 1/8 solved (+0.150 vs v0)", "trainer: the end line"]
    assert [json.loads(line)["event"] for line in lines if _is_log_record(line)] == [
        "es_update",
        "es_update",
        "order_lost",
    ]


def _drawn(raw: str) -> list[str]:
    """The lines a terminal shows for `raw`: a carriage return sends the cursor back to the line's start, and
    what follows overwrites what was there (tqdm redraws its bar so, and clears it with spaces)."""
    shown = []
    for physical in raw.split("\n"):
        cells: list[str] = []
        cursor = 0
        for ch in physical:
            if ch == "\r":
                cursor = 0
                continue
            if cursor < len(cells):
                cells[cursor] = ch
            else:
                cells.append(ch)
            cursor += 1
        shown.append("".join(cells).rstrip())
    return [line for line in shown if line]


@pytest.mark.timeout(60)
def test_on_a_terminal_log_lines_go_above_the_bar():
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))  # 24 rows, 120 columns
    proc = _child(follower)
    os.close(follower)
    raw = b""
    while True:  # read until the child has gone and the terminal has nothing left (EIO on Linux)
        ready, _, _ = select.select([leader], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(leader, 4096)
        except OSError:
            break
        if not chunk:
            break
        raw += chunk
    os.close(leader)
    assert proc.wait(timeout=30) == 0
    text = raw.decode()
    assert "policy versions" in text and "\r" in text  # a bar, drawn in place
    drawn = _drawn(text)
    bars = [line for line in drawn if line.startswith("policy versions")]
    for line in drawn:
        assert not ("policy versions" in line and ("{" in line or "trainer:" in line)), line
        assert line in bars or _is_log_record(line) or line.startswith("trainer: "), line
    assert "policy versions: 3/3 |" in text and "elapsed, the final evaluation, about 2 s" in text  # drawn, then
    assert bars[-1].startswith("policy versions: 3/3 |") and bars[-1].endswith(" elapsed")  # closed: its time
    events = [json.loads(line)["event"] for line in drawn if _is_log_record(line)]
    assert events == ["es_update", "es_update", "order_lost"]
    own = [line for line in drawn if line.startswith("trainer: ")]
    assert own == [
        "trainer: held-out v0: reward 0.100, 0/8 solved",
        "trainer: a line printed to stderr",
        "trainer: held-out v3: reward 0.250, 1/8 solved (+0.150 vs v0)",
        "trainer: the end line",
    ]
    assert drawn.index(bars[-1]) == len(drawn) - 2  # the bar stays last, above only the line after its end


def test_the_eta_counts_the_final_evaluation():
    """Started at version 0 at t = 100 s, version 2 at t = 400 s: 150 s a version; 6 of 8 left = 900 s, and the
    final evaluation took 90 s last time: 990 s = 16 min 30 s."""
    console = Console(8, stream=open(os.devnull, "w"))  # noqa: SIM115 - a stream the console only holds
    console.start = (0, 100.0)
    assert console.eta(0, 100.0) == "ETA after the first version"
    assert console.eta(2, 400.0) == "ETA 15 min 00 s and the final evaluation (2 min 30 s a version)"
    console.eval_s = 90.0
    assert console.eta(2, 400.0) == "ETA 16 min 30 s with the final evaluation (2 min 30 s a version)"
    assert console.eta(8, 1300.0) == "the final evaluation, about 1 min 30 s"
    no_eval = Console(8, final_evaluation=False, stream=console.stream)
    no_eval.start = (2, 100.0)  # a resumed run counts from where it started: 2 versions in 300 s
    assert no_eval.eta(4, 400.0) == "ETA 10 min 00 s (2 min 30 s a version)"
    # a wall-clock budget ending at t = 700 s: 300 s left at t = 400 s and the version under way then, 150 s
    timed = Console(100_000, final_evaluation=False, stream=console.stream, ends_at=700.0)
    timed.start = (0, 100.0)
    assert timed.eta(2, 400.0) == "ETA 7 min 30 s (2 min 30 s a version)"
    assert timed.eta(4, 700.0) == "ETA 2 min 30 s (2 min 30 s a version)"  # spent: the version under way
    console.stream.close()


def test_under_a_wall_clock_budget_a_version_is_counted_without_its_cap(tmp_path):
    """The budget's run has `iterations` 100,000, a cap the budget reaches first: `version 2 of 100000` would
    promise versions that never come."""
    lines = tmp_path / "console.txt"
    with lines.open("w") as stream:
        timed = Console(100_000, final_evaluation=False, stream=stream, ends_at=time.monotonic() + 600)
        timed(0)
        timed(2)
        plain = Console(8, final_evaluation=False, stream=stream)
        plain(0)
    first, second, third = lines.read_text().splitlines()
    assert first == "trainer: version 0; ETA after the first version"
    assert second.startswith("trainer: version 2 after ") and "of" not in second.split(";")[0]
    assert third == "trainer: version 0 of 8; ETA after the first version"
