"""structlog JSON logs, shared by every process."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(level: str = "INFO", service: str = "memlane") -> None:
    logging.basicConfig(stream=sys.stderr, level=level, format="%(message)s")
    # httpx2 is the HTTP client under openai: a line per model or embedding request, at
    # hundreds per second, cost the extraction worker more CPU than its own logging.
    for noisy in ("aiokafka", "kafka", "httpx", "httpx2", "httpcore", "httpcore2", "uvicorn.access"):
        logging.getLogger(noisy).setLevel("WARNING")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level)),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)
