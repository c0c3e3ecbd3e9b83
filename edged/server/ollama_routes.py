"""Ollama's API (/api/*) for the clients that speak it: generation in ollama_generation, model
facts in ollama_models, pulls in ollama_pull. Every error is Ollama's {"error": message}."""

from __future__ import annotations

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from edged.server import ollama_models, ollama_schemas
from edged.server.ollama_generation import api_chat, api_generate
from edged.server.ollama_pull import api_pull
from edged.server.errors import errors_as
from edged.server.ollama_responses import error_response
from edged.server import openapi_shapes as shapes
from edged.server.route_common import _json_body
from edged.server.spec import Operation, operation

# the Ollama release whose API this implements (think, tools, format schemas, logprobs):
# clients gate features on /api/version
OLLAMA_VERSION = "0.12.0"


# errors before the response starts as Ollama's {"error": ...} with their status
_ollama_errors = errors_as(error_response)


@operation(Operation("Ollama: the servable models", response=shapes.OLLAMA_TAGS, errors="ollama",
                     tag="ollama"))
async def api_tags(request: Request) -> Response:
    state = request.app.state.edged
    return JSONResponse({"models": await run_in_threadpool(ollama_models.tags, state)})


@operation(Operation("Ollama: the loaded models", response=shapes.OLLAMA_PS, errors="ollama",
                     tag="ollama"))
async def api_ps(request: Request) -> Response:
    state = request.app.state.edged
    return JSONResponse({"models": await run_in_threadpool(ollama_models.ps, state)})


@operation(Operation("Ollama: a model's details, metadata and template", body=ollama_schemas.SHOW,
                     response=shapes.OLLAMA_SHOW, errors="ollama", statuses=(404,), tag="ollama"))
async def api_show(request: Request) -> Response:
    state = request.app.state.edged
    v = ollama_schemas.SHOW.read(await _json_body(request))
    model = v["model"] or v["name"]
    return JSONResponse(await run_in_threadpool(ollama_models.show, state, model))


@operation(Operation("Ollama: the API version", response=shapes.OLLAMA_VERSION, errors="ollama",
                     tag="ollama"))
async def api_version(request: Request) -> Response:
    from importlib.metadata import version

    return JSONResponse({"version": OLLAMA_VERSION, "edged": version("edged")})


def ollama_routes() -> list[Route]:
    routes = [("/api/chat", api_chat, "POST"), ("/api/generate", api_generate, "POST"),
              ("/api/tags", api_tags, "GET"), ("/api/ps", api_ps, "GET"),
              ("/api/show", api_show, "POST"), ("/api/pull", api_pull, "POST"),
              ("/api/version", api_version, "GET")]
    return [Route(path, _ollama_errors(fn), methods=[method]) for path, fn, method in routes]
