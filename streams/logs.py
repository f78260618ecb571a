"""structlog as JSON lines on stderr: one event per line, with a timestamp, level and logger name."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog


class _Stderr:
    """The stderr of the moment, looked up at each write.

    Binding ``sys.stderr.buffer`` once would keep whatever stream was current at configure time: a caller
    that swapped stderr (pytest's capture, a redirect) and closed it later would make every later log line
    raise ``ValueError: I/O operation on closed file`` inside the code that logged it.
    """

    def write(self, data: bytes) -> None:
        stream = sys.stderr
        buffer = getattr(stream, "buffer", None)
        if buffer is not None:
            buffer.write(data)
        else:  # a text-only stand-in such as io.StringIO
            stream.write(data.decode("utf-8", "replace"))

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "info", *, stream=None) -> None:
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(serializer=orjson.dumps),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.BytesLoggerFactory(file=stream.buffer if stream is not None else _Stderr()),
        cache_logger_on_first_use=True,
    )


class SaidOnce(logging.Filter):
    """A standard-library logging filter that lets a message through once and then counts it: a library that
    warns the same thing on every call (vLLM's worker: "Attempted to load weight %s with dtype %s into
    parameter with dtype %s" for every tensor of every weight write, 7,080 lines of a 7,503-line
    generator.log) says it the first time, and again, with the count, at the 10th, 100th, 1000th, ... time.
    Messages are told apart by their template (the format string before its arguments)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: dict[str, int] = {}  # "<logger>: <template>" -> times it came

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}: {record.msg}"
        count = self.seen[key] = self.seen.get(key, 0) + 1
        if count == 1:
            return True
        if count < 10 or f"{count}".rstrip("0") != "1":  # 10, 100, 1000, ...: say how often, once more
            return False
        record.msg, record.args = f"{record.getMessage()} [said {count} times so far; counted, not logged]", ()
        return True


def say_once(*logger_names: str) -> SaidOnce:
    """Attach one SaidOnce to the standard-library loggers named; it is returned for its counts."""
    said = SaidOnce()
    for name in logger_names:
        logging.getLogger(name).addFilter(said)
    return said
