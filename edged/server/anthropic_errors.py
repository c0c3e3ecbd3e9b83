"""Anthropic's error shape for the /v1/messages routes:
``{"type": "error", "error": {"type": "invalid_request_error", "message": ...}}``, as a JSON
response before a stream starts and as an ``event: error`` once one has."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse

from edged.server.errors import errors_as, to_api_error

PATH_PREFIX = "/v1/messages"

# status -> Anthropic's error type (https://docs.anthropic.com/en/api/errors)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether a request path is one of the Messages API's (its errors take Anthropic's shape)."""
    return path == PATH_PREFIX or path.startswith(PATH_PREFIX + "/")


def error_body(status: int, message: str) -> dict:
    return {"type": "error", "error": {"type": _TYPES.get(status, "invalid_request_error" if
                                                          status < 500 else "api_error"),
                                       "message": message}}


def _message(e) -> str:
    """The message, naming the field when it does not yet (Anthropic's shape has no `param`)."""
    if e.param and e.param not in e.message:
        return f"{e.param}: {e.message}"
    return e.message


def error_response(exc: BaseException) -> JSONResponse:
    """The JSON response for any exception (its status and headers as the OpenAI routes give)."""
    e = to_api_error(exc)
    return JSONResponse(error_body(e.status, _message(e)), status_code=e.status, headers=e.headers)


def sse_event(name: str, data: dict) -> bytes:
    """One named server-sent event; Anthropic's clients skip events without a name."""
    payload = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {payload}\n\n".encode()


def error_event(exc: BaseException) -> bytes:
    """An error inside a started stream: the client raises it as its status's APIStatusError."""
    e = to_api_error(exc)
    return sse_event("error", error_body(e.status, _message(e)))


# a route whose errors before the response starts are Anthropic's shape
anthropic_errors = errors_as(error_response)
