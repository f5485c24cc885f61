"""Secrets kept out of every log line: the password of a URL's user info, and the value of any
query parameter whose name says it holds a secret (Gemini's ``?key=``, ``api_key``,
``access_token``, ``token``, ``password``, ``signature``, ...), in kvproxy's own lines, uvicorn's
access log and error log, and the tracebacks they carry.

``RedactSecrets`` is the one filter; ``log_config`` is uvicorn's logging configuration with it on
uvicorn's handlers, and ``redact_root_handlers`` puts it on the handlers ``logging.basicConfig``
gave the root logger (``proxy.cli``).
"""

from __future__ import annotations

import copy
import logging
import re
from typing import Any
from urllib.parse import unquote

from uvicorn.config import LOGGING_CONFIG

MASK = "***"
SECRET_NAME = re.compile(r"(?i)key|token|secret|passw|pwd|auth|signature|sig$|credential")
"""A query parameter whose name (percent-decoded) matches holds a secret. NOTE: broad on
purpose (``prompt_cache_key`` is masked too): a masked harmless value costs nothing in a log."""
_QUERY = re.compile(r"(?P<lead>[?&;])(?P<name>[^=&;?#\s\"'<>]+)=(?P<value>[^&;#\s\"'<>]*)")
_USERINFO = re.compile(r"(?<=://)(?P<user>[^/\s@:?#]*):(?P<password>[^/\s@?#]*)@")
ACCESS_LOGGER = "uvicorn.access"


def redact_secrets(text: str) -> str:
    """``text`` with every URL password and secret query value replaced by ``***`` (as
    ``store.index.redis.connect.redact_url`` shows a URL: the user kept, the password masked).
    Linear in ``len(text)``."""
    text = _USERINFO.sub(lambda m: f"{m['user']}:{MASK}@", text)
    return _QUERY.sub(
        lambda m: f"{m['lead']}{m['name']}={MASK}" if SECRET_NAME.search(unquote(m["name"])) else m[0],
        text,
    )


class RedactSecrets(logging.Filter):
    """A handler filter that redacts (``redact_secrets``) a record before it is written: its
    message with its arguments (uvicorn's access records keep their five arguments, each
    redacted, for its formatter), its traceback and stack. Never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name == ACCESS_LOGGER and isinstance(record.args, tuple):
            record.args = tuple(redact_secrets(a) if isinstance(a, str) else a for a in record.args)
        else:
            try:
                message = record.getMessage()
            except (TypeError, ValueError):
                message = str(record.msg)  # NOTE: a malformed call still logs, redacted
            record.msg, record.args = redact_secrets(message), None
        if record.exc_info:
            record.exc_text = redact_secrets(logging.Formatter().formatException(record.exc_info))
        elif record.exc_text:
            record.exc_text = redact_secrets(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_secrets(record.stack_info)
        return True


def log_config() -> dict[str, Any]:
    """uvicorn's default logging configuration (``uvicorn.config.LOGGING_CONFIG``) with
    ``RedactSecrets`` on its handlers (the error log's and the access log's)."""
    config = copy.deepcopy(LOGGING_CONFIG)
    config["filters"] = {"redact": {"()": RedactSecrets}}
    for handler in config["handlers"].values():
        handler["filters"] = ["redact"]
    return config


def redact_root_handlers() -> None:
    """Put ``RedactSecrets`` on every handler of the root logger (kvproxy's own lines, httpx's)
    that lacks it."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, RedactSecrets) for f in handler.filters):
            handler.addFilter(RedactSecrets())
