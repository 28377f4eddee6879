"""Structured JSON logs: one object per line, with whatever context a call passes in ``extra``.

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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in _NEVER and not key.startswith("_"):
                doc[key] = value
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc, default=str).decode()


def configure(level: str, fmt: str) -> None:
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
