"""GET /openapi.json: an OpenAPI 3.1 document of every route of the app, built from the Operation
each endpoint carries (edged.server.spec.operation): request bodies from the same Body specs the
parsers read through, reply schemas (edged.server.openapi_shapes), the error shapes, and the
API-key security schemes. A route without an Operation is an error, not a gap in the document."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import openapi_shapes as shapes
from edged.server.spec import Operation, operation, operations_of

_STATUS_TEXT = {400: "invalid request (the message and param name the field)", 401: "missing or wrong API key",
                404: "unknown model or item", 413: "request body too large", 431: "request headers too large",
                500: "generation failed", 503: "not serving yet (loading), queue full or shutting down; "
                "see Retry-After"}
_TAGS = [{"name": "openai", "description": "OpenAI-compatible API"},
         {"name": "llama-server", "description": "llama-server's tokenize / detokenize"},
         {"name": "ollama", "description": "Ollama's API; errors are {\"error\": message}"},
         {"name": "anthropic", "description": "Anthropic's Messages API; errors are {\"type\": \"error\", "
          "\"error\": {\"type\", \"message\"}}"},
         {"name": "server", "description": "health, metrics and this document"}]


class MissingOperation(Exception):
    """A route whose endpoint carries no Operation: the document would leave it out."""


def _path_and_parameters(route: Route) -> tuple[str, list[dict]]:
    """Starlette's '/v1/models/{model_id:path}' as OpenAPI's '/v1/models/{model_id}' and its
    path parameters."""
    path, params = route.path, []
    for name in route.param_convertors:
        path = path.replace(f"{{{name}:path}}", f"{{{name}}}")
        params.append({"name": name, "in": "path", "required": True, "schema": {"type": "string"}})
    return path, params


def _error(op: Operation, status: int) -> dict:
    # the middleware (Host, key, sizes) answers in OpenAI's shape on every route
    own = {"ollama": shapes.OLLAMA_ERROR, "anthropic": shapes.ANTHROPIC_ERROR}.get(op.errors)
    schema = shapes.ERROR if own is None else {"anyOf": [own, shapes.ERROR]}
    return {"description": _STATUS_TEXT.get(status, "error"),
            "content": {"application/json": {"schema": schema}}}


def _success(op: Operation) -> dict:
    content = {op.media: {"schema": op.response if op.response is not None else {"type": "string"}}}
    if op.stream_media == "text/event-stream":
        content[op.stream_media] = {"schema": shapes.sse_events(op.stream_item)}
    elif op.stream_media is not None:
        content[op.stream_media] = {"schema": shapes.ndjson_line(op.stream_item)}
    desc = "the reply" + (f"; with stream: true, {op.stream_media}" if op.stream_media else "")
    return {"description": desc, "content": content}


def _operation(op: Operation, op_id: str, params: list[dict], components: dict) -> dict:
    out: dict = {"operationId": op_id, "summary": op.summary, "tags": [op.tag]}
    if op.description:
        out["description"] = op.description
    if params:
        out["parameters"] = params
    statuses = {400, 431, *op.statuses}
    if op.body is not None:
        components[op.body.name] = op.body.schema()
        out["requestBody"] = {"required": True, "content": {"application/json": {
            "schema": {"$ref": f"#/components/schemas/{op.body.name}"}}}}
        statuses.add(413)
    if op.public:
        out["security"] = []
    else:
        statuses.add(401)
    responses = {"200": _success(op)}
    responses.update({str(s): _error(op, s) for s in sorted(statuses)})
    responses.update(op.responses)
    out["responses"] = responses
    return out


def build_document(routes, version: str) -> dict:
    """The OpenAPI document of `routes` (every one must carry an Operation)."""
    paths: dict = {}
    components: dict = {}
    for route in routes:
        if not isinstance(route, Route):
            raise MissingOperation(f"{route!r} is not a plain Route; the document cannot describe it")
        ops = operations_of(route.endpoint)
        if ops is None:
            raise MissingOperation(f"route {route.path} has no Operation: decorate its endpoint with "
                                   "edged.server.spec.operation (docs/SERVER.md, OpenAPI)")
        path, params = _path_and_parameters(route)
        for method in sorted(route.methods - {"HEAD"}):
            op = ops.get(method, ops.get("*"))
            if op is None:
                continue
            op_id = method.lower() + path.replace("/", "_").replace("{", "").replace("}", "").replace(".", "_")
            paths.setdefault(path, {})[method.lower()] = _operation(op, op_id, params, components)
    return {
        "openapi": "3.1.0",
        "info": {"title": "edged", "version": version, "description":
                 "A local LLM inference server: OpenAI's API, llama-server's tokenize and Ollama's API. "
                 "The API key is needed only when the server runs with --api-key. Unknown request "
                 "fields are ignored; limits set by the loaded model (its vocabulary, its context) "
                 "are checked when it is known (x-maximum)."},
        "tags": _TAGS,
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"}}},
        "security": [{"bearer": []}, {"apiKey": []}],
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("edged")
    except PackageNotFoundError:
        return "0"


@operation(Operation("This OpenAPI 3.1 document", response=shapes.OPENAPI_DOC, tag="server"))
async def openapi_json(request: Request) -> Response:
    doc = getattr(request.app.state, "openapi", None)
    if doc is None:  # built once per app, from its own routes
        doc = request.app.state.openapi = build_document(request.app.routes, _version())
    return JSONResponse(doc)
