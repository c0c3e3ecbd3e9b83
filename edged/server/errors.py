"""The server's one exception -> HTTP status mapper, producing OpenAI's error JSON:
``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``."""

from __future__ import annotations

import functools

import json
import logging

from starlette.responses import JSONResponse

log = logging.getLogger("edged.server")

# status -> OpenAI's error `type` for that status
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "service_unavailable",
}


class APIError(Exception):
    """An error with its HTTP status; `param` names the offending request field, if any."""

    def __init__(self, status: int, message: str, *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 for an invalid field."""
    return APIError(400, message, param=param, code=code)


def unavailable(message: str, retry_after: int = 1) -> APIError:
    """A 503 telling the client when to retry (queue full, draining, still loading)."""
    return APIError(503, message, code="unavailable", headers={"Retry-After": str(retry_after)})


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object for a status."""
    return {"error": {"message": message, "type": _TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


def to_api_error(exc: BaseException) -> APIError:
    """Map any exception to an APIError: ours keep their status; bad JSON and ValueError-family
    validation errors (sampling params, chat templates, engine admission) are 400; the rest 500."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return bad_request(f"request body is not valid JSON: {exc}", code="invalid_json")
    field = getattr(exc, "field", None)  # ConstraintError, ToolError: the request field at fault
    if isinstance(exc, ValueError) and isinstance(field, str) and hasattr(exc, "message"):
        return bad_request(f"{field}: {exc.message}", field)
    if isinstance(exc, (ValueError, TypeError, OverflowError)):
        # SamplingParams, ChatTemplateError, AdmissionError, tokenizer input checks
        return bad_request(str(exc))
    log.exception("internal error", exc_info=exc)
    return APIError(500, f"internal error: {type(exc).__name__}", code="internal_error")


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for any exception."""
    e = to_api_error(exc)
    return JSONResponse(error_body(e.status, e.message, e.param, e.code), status_code=e.status,
                        headers=e.headers)


def sse_error_event(exc: BaseException) -> bytes:
    """An error delivered inside an already-started SSE stream (the status line is gone)."""
    e = to_api_error(exc)
    return b"data: " + json.dumps(error_body(e.status, e.message, e.param, e.code)).encode() + b"\n\n"


def errors_as(to_response):
    """Route decorator: an exception raised before the response starts is answered by
    to_response(exc) (an API's own error shape: Ollama's, Anthropic's)."""
    def decorate(handler):
        @functools.wraps(handler)
        async def wrapped(request):
            try:
                return await handler(request)
            except Exception as e:
                return to_response(e)
        return wrapped
    return decorate
