"""structlog as JSON lines on stderr: one event per line, with a timestamp, level and logger name."""

from __future__ import annotations

import logging
import sys

import orjson
import structlog


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
        logger_factory=structlog.BytesLoggerFactory(file=(stream or sys.stderr).buffer),
        cache_logger_on_first_use=True,
    )
