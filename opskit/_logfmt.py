"""The JSON and plain-text log formats and the root logging set-up shared by every service."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, Literal, TextIO

from opskit._redact import masked

LogFormat = Literal["json", "text"]
FORMATS: tuple[LogFormat, ...] = ("json", "text")
# uvicorn's loggers: with ``log_config=None`` uvicorn installs no handlers, so they propagate here.
UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "uvicorn.asgi")


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``timestamp`` (ISO 8601, UTC, milliseconds),
    ``level``, ``logger``, ``message``, ``request_id`` (the record's ``request_id`` attribute,
    from ``extra=``, else null), ``pid`` (the writing process's id), and when the record carries an exception ``reason``
    (``"ExceptionType: text"``) and ``traceback``. A message that is itself a JSON object
    (the router's access line) is merged in: its keys join the line, the standard keys win, and
    ``message`` is its own ``message`` or ``"request"``. The secret parts
    registered with :func:`opskit.hide_in_logs` are masked: libraries log the settings they
    were given (a model URL with a token in it)."""

    def format(self, record: logging.LogRecord) -> str:
        message = masked(record.getMessage())
        line: dict[str, Any] = {}
        if message.startswith("{"):
            try:
                parsed = json.loads(message)
            except ValueError:
                parsed = None
            if isinstance(parsed, dict):
                message = str(parsed.pop("message", "request"))
                line.update(parsed)
        line.update(
            {
                "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
                "level": record.levelname,
                "logger": record.name,
                "message": message,
                "request_id": getattr(record, "request_id", line.get("request_id")),
                "pid": record.process,  # which process wrote it: router serve --workers N runs several
            }
        )
        if record.exc_info and record.exc_info[0] is not None:
            exc = record.exc_info[1]
            line["reason"] = masked(f"{type(exc).__name__}: {exc}")
            line["traceback"] = masked(self.formatException(record.exc_info))
        elif record.exc_text:
            line["traceback"] = masked(record.exc_text)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """``2026-01-01T00:00:00.000+00:00 INFO router: message`` (plus ``[request_id]`` when the
    record has one, and the traceback on following lines): for reading in a terminal; registered
    secret parts are masked, as in :class:`JsonFormatter`."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        request_id = getattr(record, "request_id", None)
        text = f"{stamp} {record.levelname} {record.name}: {masked(record.getMessage())}"
        if request_id:
            text += f" [{request_id}]"
        if record.exc_info and record.exc_info[0] is not None:
            text += "\n" + masked(self.formatException(record.exc_info))
        return text


def configure(
    fmt: LogFormat = "json", level: int | str = logging.INFO, stream: TextIO | None = None
) -> logging.Handler:
    """Send every record of the process to ``stream`` (default stderr) in ``fmt``: one handler
    on the root logger, replacing any it had; uvicorn's loggers lose their own handlers and
    levels and propagate to it (serve uvicorn with ``log_config=None``); Python warnings become records of
    logger ``py.warnings``. ``level``: a logging level or its
    name. Returns the handler. Raises ValueError for an unknown ``fmt``."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown log format {fmt!r}; known: {', '.join(FORMATS)}")
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in UVICORN_LOGGERS:
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
        # An earlier logging.config (uvicorn's own dictConfig) may have set a level or disabled
        # the logger: the root's level rules here.
        logger.setLevel(logging.NOTSET)
        logger.disabled = False
    logging.captureWarnings(True)  # warnings.warn output as records (logger py.warnings), not raw stderr
    return handler
