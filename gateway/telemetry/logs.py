"""Structured logs: one JSON object per line (or ``key=value`` text), with whatever context a call passes
in ``extra``.

Prompt text, keys and headers are never passed to the logger by the gateway's own code; fields that
could carry them are refused here as well, so a careless ``extra`` cannot leak them.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import orjson

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
_NEVER = {"prompt", "messages", "content", "authorization", "api_key", "headers", "color_message"}


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """What a call passed in ``extra``, less what must never be logged."""
    return {
        key: value
        for key, value in vars(record).items()
        if key not in _STANDARD and key not in _NEVER and not key.startswith("_")
    }


def _stamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _stamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def _text_value(value: Any) -> str:
    """A bare word where it is one, else JSON (quoted strings, lists, mappings): one line, greppable."""
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    if isinstance(value, float):
        return f"{value:g}"
    return orjson.dumps(value, default=str).decode()


class TextFormatter(logging.Formatter):
    """For people: time, level, logger, message, then the same fields as the JSON line as ``key=value``."""

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={_text_value(v)}" for k, v in _fields(record).items() if v is not None)
        line = f"{_stamp(record)} {record.levelname} {record.name} {record.getMessage()}"
        line = f"{line} {fields}" if fields else line
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
