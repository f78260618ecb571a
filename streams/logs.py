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
