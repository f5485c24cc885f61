"""OpenAI-shaped errors: ``{"error": {"message", "type", "param", "code"}}`` with a status."""

from __future__ import annotations

import logging
import re

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

_UNION_TAG = re.compile(
    r"^(str|int|float|bool|none|list\[.*\]|dict\[.*\]|literal\[.*\]|function-.*|[A-Z]\w*)$"
)


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

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves the server in OpenAI's shape; FastAPI's 422 becomes a 400."""

    @app.exception_handler(OpenAIError)
    async def _openai(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        # NOTE: pydantic names the member of a union it tried (``prompt.str``); clients want the field.
        loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p))]
        message = first.get("msg", "invalid request")
        if first.get("type") == "json_invalid":
            message, loc = (
                f"the request body is not valid JSON ({first.get('ctx', {}).get('error', 'parse error')})",
                [],
            )
        elif first.get("type") == "missing" and not loc:
            message = "the request needs a JSON body"
        param = ".".join(loc) or None
        return OpenAIError(400, f"{param}: {message}" if param else message, param=param).response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return OpenAIError(exc.status_code, str(exc.detail), type=kind).response()

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error", exc_info=exc)
        return OpenAIError(500, "internal server error", type="server_error").response()
