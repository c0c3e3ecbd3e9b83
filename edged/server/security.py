"""Safe defaults as one ASGI middleware: Host allow-list (DNS rebinding), header and body size
limits, and the API key check. CORS is added by the app only when origins are configured."""

from __future__ import annotations

import asyncio
import hmac
import json
import time

from edged.server.config import LOOPBACK_NAMES, ServerConfig
from edged.server.anthropic_errors import error_body as anthropic_error_body, is_anthropic_path
from edged.server.errors import error_body

# paths that answer without an API key (liveness probes)
PUBLIC_PATHS = frozenset({"/health"})


def host_allow_list(config: ServerConfig) -> frozenset[str]:
    """Host names (no port, lower case) a request's Host header may carry."""
    names = {n.lower() for n in LOOPBACK_NAMES}
    names.add("[::1]")
    bound = config.host.lower()
    if bound not in ("0.0.0.0", "::", "[::]"):
        names.add(bound if ":" not in bound or bound.startswith("[") else f"[{bound}]")
    names.update(h.strip().lower() for h in config.allowed_hosts if h.strip())
    return frozenset(names)


def host_name(host_header: str) -> str:
    """'Example.com:8080' -> 'example.com'; '[::1]:80' -> '[::1]'."""
    h = host_header.strip().lower()
    if h.startswith("["):
        end = h.find("]")
        return h[: end + 1] if end > 0 else h
    return h.rsplit(":", 1)[0] if h.count(":") == 1 else h


def check_api_key(presented: str | None, keys: tuple[str, ...]) -> bool:
    """Constant-time comparison against every configured key."""
    if presented is None:
        return False
    ok = False
    p = presented.encode()
    for k in keys:
        ok |= hmac.compare_digest(p, k.encode())
    return ok


def _presented_key(headers: dict[bytes, bytes]) -> str | None:
    auth = headers.get(b"authorization")
    if auth is not None:
        scheme, _, token = auth.decode("latin-1").partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    key = headers.get(b"x-api-key")
    return key.decode("latin-1").strip() if key is not None else None


async def _reject(send, status: int, message: str, code: str, extra_headers=(), path: str = "") -> None:
    # the Messages API's clients parse Anthropic's error shape
    shaped = anthropic_error_body(status, message) if is_anthropic_path(path) else error_body(
        status, message, code=code)
    body = json.dumps(shaped).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + list(extra_headers)})
    await send({"type": "http.response.body", "body": body})


class BodyTooLarge(Exception):
    """Raised from receive() when a body streams past the limit (mapped to 413)."""


class BodyTimeout(Exception):
    """Raised from receive() when the body has not fully arrived within --body-timeout (408)."""


class SecurityMiddleware:
    """Rejects, before any route runs: a Host not on the allow-list (400; empty or missing too),
    headers over the size limit (431), a declared body over the limit (413), and a missing or
    wrong API key when keys are configured (401). A body that streams past the limit without a
    Content-Length raises BodyTooLarge from receive(), which the app maps to 413; one still
    arriving --body-timeout seconds after the request began raises BodyTimeout (408)."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.allowed = host_allow_list(config)
        self.allow_any_host = "*" in self.allowed
        self.keys = tuple(config.api_keys)
        self.max_body = config.max_body_bytes
        self.max_headers = config.max_header_bytes
        self.body_timeout = config.body_timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        raw = scope.get("headers") or []
        if sum(len(k) + len(v) + 4 for k, v in raw) > self.max_headers:
            return await _reject(send, 431, "request headers too large", "headers_too_large")
        headers: dict[bytes, bytes] = {}
        for k, v in raw:
            if k in headers and k == b"host":  # two Host headers: ambiguous, refuse
                return await _reject(send, 400, "duplicate Host header", "invalid_host")
            headers[k] = v
        host = host_name(headers.get(b"host", b"").decode("latin-1"))
        if not host or not (self.allow_any_host or host in self.allowed):
            return await _reject(send, 400, "Host header missing or not allowed (add it with "
                                 "--allowed-host)", "invalid_host")
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
            except ValueError:
                return await _reject(send, 400, "invalid Content-Length", "invalid_request")
            if n > self.max_body:
                return await _reject(send, 413, f"request body over {self.max_body} bytes",
                                     "body_too_large", path=scope["path"])
        if (self.keys and scope["path"] not in PUBLIC_PATHS and scope.get("method") != "OPTIONS"
                and not check_api_key(_presented_key(headers), self.keys)):
            return await _reject(send, 401, "missing or invalid API key (send 'Authorization: "
                                 "Bearer KEY' or 'x-api-key: KEY')", "invalid_api_key",
                                 [(b"www-authenticate", b"Bearer")], path=scope["path"])
        return await self.app(scope, self._limited(receive), send)

    def _limited(self, receive):
        seen = 0
        deadline = time.monotonic() + self.body_timeout
        body_done = False  # after the body, receive() only waits for the disconnect: no deadline

        async def wrapped():
            nonlocal seen, body_done
            if body_done:
                return await receive()
            try:  # a client trickling its body (one byte a second) must not hold the request
                msg = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except asyncio.TimeoutError:
                raise BodyTimeout(f"the request body did not arrive within {self.body_timeout:g} s "
                                  "(--body-timeout)") from None
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge(f"request body over {self.max_body} bytes")
                body_done = not msg.get("more_body", False)
            return msg

        return wrapped
