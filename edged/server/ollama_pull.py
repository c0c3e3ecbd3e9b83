"""/api/pull: `edged pull` (edged.store.pull: the catalogue's models, fetched with pip) run in a
thread, its progress streamed as Ollama's NDJSON status lines. Only catalogue names pull; the
pull goes on if the client leaves (as Ollama's), and the new entry is servable at once."""

from __future__ import annotations

import asyncio
import threading
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edged.server import ollama_schemas
from edged.server.errors import APIError, bad_request
from edged.server.ollama_responses import NDJSONResponse, error_object, line
from edged.server import openapi_shapes as shapes
from edged.server.route_common import _json_body
from edged.server.spec import Operation, operation

PROGRESS_EVERY_S = 0.25  # at most one download line this often (the last one always)
_END = object()


def _store(state):
    from edged.store import ModelStore

    return state.models.store if state.models.store is not None else ModelStore()


def _entry(name: str):
    """The catalogue entry; 404 listing the catalogue for any other name."""
    from edged.store import StoreError
    from edged.store.catalogue import lookup

    try:
        return lookup(name)
    except StoreError as e:
        raise APIError(404, str(e), param="model", code="model_not_found") from None


class _PullThread:
    """Runs one pull, handing status objects to the event loop's queue."""

    def __init__(self, store, entry, loop: asyncio.AbstractEventLoop):
        self.store, self.entry, self.loop = store, entry, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self._last = 0.0
        f = entry.files[0]
        self.digest = f"sha256:{f.sha256}"
        self.total = sum(x.size for x in entry.files)

    def put(self, obj) -> None:
        self.loop.call_soon_threadsafe(self.queue.put_nowait, obj)

    def progress(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < PROGRESS_EVERY_S:
            return
        self._last = now
        self.put({"status": f"pulling {self.entry.files[0].sha256[:12]}", "digest": self.digest,
                  "total": total, "completed": done})

    def run(self) -> None:
        from edged.store.pull import pull

        try:
            self.put({"status": "pulling manifest"})
            _, fetched = pull(self.store, self.entry.name, progress=self.progress,
                              log=lambda s: self.put({"status": s}))
            if not fetched:
                self.put({"status": f"{self.entry.name} is up to date"})
            self.put({"status": "success"})
        except Exception as e:  # StoreError (pip failed, sha mismatch, invalid GGUF) and the rest
            self.put(APIError(500, f"pull {self.entry.name} failed: {e}", code="pull_failed"))
        finally:
            self.put(_END)

    def start(self) -> "_PullThread":
        threading.Thread(target=self.run, name="edged-pull", daemon=True).start()
        return self

    async def events(self):
        while True:
            obj = await self.queue.get()
            if obj is _END:
                return
            yield obj


@operation(Operation("Ollama: pull a catalogue model into the store", body=ollama_schemas.PULL,
                     response=shapes.OLLAMA_PULL, stream_media="application/x-ndjson",
                     stream_item=shapes.OLLAMA_PULL, errors="ollama", statuses=(404, 500), tag="ollama"))
async def api_pull(request: Request) -> Response:
    state = request.app.state.edged
    v = ollama_schemas.PULL.read(await _json_body(request))
    name = v["model"] or v["name"]
    if not name:
        raise bad_request("'model' is required: the catalogue name to pull", "model")
    stream = v["stream"]
    job = _PullThread(_store(state), _entry(name), asyncio.get_running_loop()).start()
    if stream:
        return NDJSONResponse(_lines(job), lambda: None)
    last = None
    async for obj in job.events():
        if isinstance(obj, APIError):
            raise obj
        last = obj
    return JSONResponse(last)


async def _lines(job: _PullThread):
    async for obj in job.events():
        yield line(error_object(obj)[0] if isinstance(obj, APIError) else obj)
