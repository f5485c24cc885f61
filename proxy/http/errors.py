"""Errors as clients expect them: OpenAI's ``{"error": {"message", "type", "param", "code"}}``,
Anthropic's ``{"type": "error", "error": {"type", "message"}}`` on the Messages API, or Google's
``{"error": {"code", "message", "status"}}`` on the Gemini API, with a status."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Literal, Never, TypedDict, TypeVar

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic_core import ErrorDetails
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from store.index.redis.connect import REDIS_ERRORS

log = logging.getLogger(__name__)
T = TypeVar("T")

_UNION_TAG = re.compile(
    r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|literal\[.*\]|function-.*|[A-Z]\w*)$"
)


ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
}


class OpenAIErrorDetail(TypedDict):
    """OpenAI's ``error``: the message, its type, the field it names and a code."""

    message: str
    type: str
    param: str | None
    code: str | None


class OpenAIErrorBody(TypedDict):
    """OpenAI's error body."""

    error: OpenAIErrorDetail


class AnthropicErrorDetail(TypedDict):
    """Anthropic's ``error``: its type (``ERROR_TYPES``) and message."""

    type: str
    message: str


class AnthropicErrorBody(TypedDict):
    """Anthropic's error body."""

    type: Literal["error"]
    error: AnthropicErrorDetail


class GoogleErrorDetail(TypedDict):
    """Google's ``error``: the HTTP status, the message and the canonical code (``GOOGLE_STATUS``)."""

    code: int
    message: str
    status: str


class GoogleErrorBody(TypedDict):
    """Google's error body."""

    error: GoogleErrorDetail


def error_body(status: int, message: str) -> AnthropicErrorBody:
    """Anthropic's error shape: ``{"type": "error", "error": {"type", "message"}}``."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


class OpenAIError(Exception):
    """An error a client sees, in OpenAI's shape."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    @classmethod
    def cache_unavailable(cls, detail: str = "") -> OpenAIError:
        """503: the cache's index (Redis) is unreachable."""
        return cls(503, f"Redis is unreachable{detail}", type="server_error", code="cache_unavailable")

    def response(self, dialect: str = "openai") -> JSONResponse:
        """The error in OpenAI's shape, or Anthropic's (``dialect="anthropic"``, the Messages API),
        or Google's ``{"error": {"code", "message", "status"}}`` (``"gemini"``)."""
        body: OpenAIErrorBody | AnthropicErrorBody | GoogleErrorBody = {
            "error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        }
        text = (
            f"{self.param}: {self.message}" if self.param and self.param not in self.message else self.message
        )
        if dialect == "anthropic":
            body = error_body(self.status, text)
        elif dialect == "gemini":
            status = GOOGLE_STATUS.get(self.status, "INTERNAL")
            body = {"error": {"code": self.status, "message": text, "status": status}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


GOOGLE_STATUS = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    409: "ALREADY_EXISTS",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    503: "UNAVAILABLE",
}
"""HTTP statuses as Google's canonical error codes (anything else: ``INTERNAL``)."""


async def on_redis(fn: Callable[..., T], *args: Any, detail: Callable[[Exception], str]) -> T:
    """``fn(*args)`` in a worker thread, for state kept in Redis (named caches, stored responses).

    Raises:
        OpenAIError: 503 (``cache_unavailable``, its message ending with ``detail(fault)``) when
            Redis fails (``REDIS_ERRORS``).
    """
    try:
        return await run_in_threadpool(fn, *args)
    except REDIS_ERRORS as exc:
        raise OpenAIError.cache_unavailable(detail(exc)) from exc


def dialect(path: str) -> str:
    """``"anthropic"`` for the Messages API's routes (``path``), ``"gemini"`` for the Gemini API's
    (``/v1beta/``), else ``"openai"``."""
    if path.startswith("/v1beta/"):
        return "gemini"
    return "anthropic" if path.startswith("/v1/messages") else "openai"


def served_routes(app: FastAPI) -> list[str]:
    """``METHOD /path`` of every API route ``app`` serves (its OpenAPI paths, generated once)."""
    paths = app.openapi().get("paths", {})
    return [f"{method.upper()} {path}" for path, operations in paths.items() for method in operations]


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves the server in OpenAI's shape; FastAPI's 422 becomes a 400."""

    @app.exception_handler(OpenAIError)
    async def _openai(request: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response(dialect(request.url.path))

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        # NOTE: a union field fails once per member; the deepest failure is the one that names
        # what is wrong (``messages[0].content[0].cache_control.ttl``, not ``...content: not a str``).
        errors: list[ErrorDetails] = list(exc.errors())
        first: ErrorDetails | dict[str, Never] = max(errors, key=lambda e: len(e.get("loc", ())), default={})
        # NOTE: pydantic names the member of a union it tried (``prompt.str``); clients want the field.
        loc = [p for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p))]
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message, loc = (
                f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})",
                [],
            )
        elif first.get("type") == "missing" and not loc:
            message = "the request needs a JSON body"
        param = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".") or None
        error = OpenAIError(400, f"{param}: {message}" if param else message, param=param)
        return error.response(dialect(request.url.path))

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        message = str(exc.detail)
        if exc.status_code in (404, 405) and message in ("Not Found", "Method Not Allowed"):
            kind = "invalid_request_error"
            message = (
                f"{request.method} {request.url.path} is not a route of this server; "
                f"its routes: {', '.join(served_routes(request.app))}"
            )
        return OpenAIError(exc.status_code, message, type=kind).response(dialect(request.url.path))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        error = OpenAIError(500, "internal server error", type="server_error")
        return error.response(dialect(request.url.path))
