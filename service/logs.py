"""Logging: every line carries the request id of the request it belongs to; text or JSON lines.

``RTSERVE_LOG_FORMAT=json`` writes one JSON object per line (``time``, ``level``, ``logger``, ``message``,
``request_id`` and any ``extra`` fields such as the access log's ``method``, ``route``, ``status``); ``text``
writes ``time level logger [request id]: message``. The request id is a context variable set by
:class:`service.middleware.RequestScope`, so lines logged by handlers, the runtime or uvicorn while a
request runs carry it without passing it around.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar

request_id_var: ContextVar[str] = ContextVar("rtserve_request_id", default="-")

# attributes every LogRecord has: anything else on a record came from ``extra=`` and goes into the JSON line
_RECORD_FIELDS = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "asctime", "request_id"}


class RequestIdFilter(logging.Filter):
    """Puts the current request id on every record (``-`` outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "request_id"):
            record.request_id = request_id_var.get()
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": getattr(record, "request_id", "-"),
        }
        line |= {key: value for key, value in record.__dict__.items() if key not in _RECORD_FIELDS}
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class NoConnectionLines(logging.Filter):
    """Drops uvicorn's line per WebSocket connection (``127.0.0.1:5000 - "WebSocket /sessions/<id>/stream"
    [accepted]``): it names the session's id, which stays out of logs; the service writes its own access lines,
    with the route template (``RTSERVE_ACCESS_LOG``)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (isinstance(record.msg, str) and record.msg.startswith('%s - "WebSocket %s"'))


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


def configure_logging(level: str, log_format: str) -> None:
    """One handler on the root logger; uvicorn's loggers propagate to it (their own handlers are dropped)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(existing, NoConnectionLines) for existing in uvicorn_errors.filters):
        uvicorn_errors.addFilter(NoConnectionLines())


def uvicorn_log_config() -> dict:
    """uvicorn's ``log_config``: keep ours (uvicorn would otherwise install its own handlers)."""
    return {"version": 1, "disable_existing_loggers": False}
