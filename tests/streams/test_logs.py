"""Log lines go to the stderr of the moment, so a stream swapped in and closed by a caller breaks nothing."""

from __future__ import annotations

import io
import sys

import orjson
import structlog

from streams import logs


def _swap_stderr():
    raw = io.BytesIO()
    text = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    return raw, text


def test_logging_after_the_configure_time_stderr_was_closed_writes_to_the_current_one():
    saved = sys.stderr
    first_raw, first = _swap_stderr()
    second_raw, second = _swap_stderr()
    try:
        sys.stderr = first
        logs.configure("info")
        log = structlog.get_logger("test_logs")
        log.info("first_event", n=1)
        first_bytes = first_raw.getvalue()
        first.close()  # what pytest does to a test's captured stderr when the test ends
        sys.stderr = second
        log.info("second_event", n=2)  # raised "I/O operation on closed file" when stderr was bound once
        second_bytes = second_raw.getvalue()
    finally:
        sys.stderr = saved
        logs.configure("warning")
    assert orjson.loads(first_bytes.splitlines()[-1])["event"] == "first_event"
    line = orjson.loads(second_bytes.splitlines()[-1])
    assert line["event"] == "second_event" and line["n"] == 2 and line["level"] == "info"


def test_a_text_only_stderr_gets_the_line_too():
    saved = sys.stderr
    sys.stderr = io.StringIO()
    try:
        logs.configure("info")
        structlog.get_logger("test_logs").warning("text_event")
        out = sys.stderr.getvalue()
    finally:
        sys.stderr = saved
        logs.configure("warning")
    assert orjson.loads(out.splitlines()[-1])["event"] == "text_event"
