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


def test_a_warning_repeated_on_every_call_is_said_once_then_counted():
    import logging

    logger = logging.getLogger("test_logs.chatty")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    logger.addHandler(handler)
    said = logs.say_once("test_logs.chatty")
    try:
        for i in range(1000):  # one warning per tensor per write, each with its own arguments
            logger.warning("Attempted to load weight %s with dtype %s", f"layers.{i}.weight", "torch.float32")
        logger.warning("something else %d", 1)
    finally:
        logger.removeHandler(handler)
        logger.filters.clear()
    lines = out.getvalue().splitlines()
    assert lines == [
        "Attempted to load weight layers.0.weight with dtype torch.float32",
        "Attempted to load weight layers.9.weight with dtype torch.float32 [said 10 times so far; counted, not logged]",
        "Attempted to load weight layers.99.weight with dtype torch.float32 [said 100 times so far; counted, not "
        "logged]",
        "Attempted to load weight layers.999.weight with dtype torch.float32 [said 1000 times so far; counted, not "
        "logged]",
        "something else 1",
    ]
    assert said.seen == {
        "test_logs.chatty: Attempted to load weight %s with dtype %s": 1000,
        "test_logs.chatty: something else %d": 1,
    }
