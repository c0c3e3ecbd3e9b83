"""/v1/embeddings (OpenAI's shape): each input is a prefill-only engine request batched with the
generations; its pooled hidden state comes back L2-normalised (after `dimensions` truncates it),
as float lists or base64 little-endian float32."""

from __future__ import annotations

import asyncio
import base64
import functools
import uuid

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from edged.engine.pooling import normalize, pooling_for
from edged.engine.stream import Delta
from edged.server import openapi_shapes as shapes
from edged.server import schemas
from edged.server.errors import APIError, bad_request
from edged.server.generation import until_disconnect
from edged.server.model_slot import ModelSlot
from edged.server.route_common import _prepare
from edged.server.spec import Operation, operation

EMBEDDING_LIST = shapes.obj({
    "object": shapes.const("list"), "model": shapes.STR,
    "data": shapes.array(shapes.obj({"object": shapes.const("embedding"), "index": shapes.INT,
                                     "embedding": {"anyOf": [shapes.array(shapes.NUM), shapes.STR]}})),
    "usage": shapes.obj({"prompt_tokens": shapes.INT, "total_tokens": shapes.INT})})


class EmbeddingJob:
    """One HTTP request's inputs through the engine, at most `window` at a time (a 2048-input
    request takes one admission seat and never floods the engine's queue). Runs on the loop."""

    def __init__(self, slot: ModelSlot, request_id: str, inputs: list[list[int]], pooling: str):
        self.slot, self.request_id, self.inputs, self.pooling = slot, request_id, inputs, pooling
        self.window = max(1, slot.config.max_seqs)
        self.results: list = [None] * len(inputs)
        self.error: str | None = None
        self._next = 0
        self._running: set[str] = set()
        self._done = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._held = False

    def start(self) -> None:
        """Reserve one seat (503 when the server is full) and queue the first inputs."""
        self.slot.acquire(1)
        self._held = True
        self._loop = asyncio.get_running_loop()
        self._fill()

    def _fill(self) -> None:
        while self.error is None and self._next < len(self.inputs) and len(self._running) < self.window:
            i = self._next
            self._next += 1
            rid = f"{self.request_id}-{i}"
            try:
                self.slot.engine.add_embedding(self.inputs[i], self.pooling, request_id=rid, loop=self._loop,
                                               sink=functools.partial(self._on_delta, i, rid))
            except ValueError as e:  # checked before: only a model unloaded meanwhile gets here
                self.error = str(e)
                break
            self._running.add(rid)
            self.slot.live_ids.add(rid)
        if not self._running and (self.error is not None or self._next == len(self.inputs)):
            self._done.set()

    def _on_delta(self, i: int, rid: str, d: Delta) -> None:
        self._running.discard(rid)
        self.slot.live_ids.discard(rid)
        if d.finish_reason == "stop":
            self.results[i] = d.embedding
        elif self.error is None:
            self.error = d.error or f"input {i} ended with {d.finish_reason}"
        self._fill()

    async def wait(self) -> list:
        await self._done.wait()
        return self.results

    def close(self) -> None:
        """Abort whatever still runs and give the seat back. Idempotent."""
        self.error = self.error or "closed"
        for rid in list(self._running):
            self.slot.engine.abort(rid)
            self.slot.live_ids.discard(rid)
        self._running.clear()
        if self._held:
            self._held = False
            self.slot.release(1)


def _encoded(vec, dimensions: int | None, fmt: str):
    v = normalize(vec, dimensions)
    if fmt == "base64":
        return base64.b64encode(v.astype("<f4").tobytes()).decode("ascii")
    return v.tolist()


@operation(Operation("Embeddings of texts or token ids", body=schemas.EMBEDDINGS, response=EMBEDDING_LIST,
                     statuses=(404, 500, 503)))
async def embeddings(request: Request) -> Response:
    slot, req, model = await _prepare(request, schemas.parse_embeddings)
    hp = slot.engine.model.hparams
    if req.dimensions is not None and req.dimensions > hp.n_embd:
        raise bad_request(f"'dimensions' must be <= {hp.n_embd} (this model's embedding size), got "
                          f"{req.dimensions}", "dimensions")
    try:
        pooling = pooling_for(hp.pooling_type, slot.config.pooling)
    except ValueError as e:
        raise bad_request(str(e), "model") from None
    tok = slot.tokenizer

    def encode_all():
        return [tok.encode(x, add_special=True, parse_special=True) if isinstance(x, str) else x
                for x in req.inputs]

    inputs = await run_in_threadpool(encode_all)
    limit = slot.max_len
    for i, ids in enumerate(inputs):
        name = f"input[{i}]" if len(inputs) > 1 else "input"
        if not ids:
            raise bad_request(f"'{name}' gives no tokens", name)
        if len(ids) > limit:
            raise bad_request(f"'{name}' has {len(ids)} tokens; this model's context holds {limit}",
                              name, code="context_length_exceeded")
    job = EmbeddingJob(slot, f"embd-{uuid.uuid4().hex}", inputs, pooling)
    try:
        job.start()
        ok, results = await until_disconnect(job.wait(), request.receive)
        if not ok:
            return Response(status_code=499)
        if job.error is not None:
            raise APIError(500, f"embedding failed: {job.error}", code="engine_error")
    finally:
        job.close()
    n = sum(len(ids) for ids in inputs)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, req.dimensions, req.encoding_format)}
            for i, v in enumerate(results)]
    return JSONResponse({"object": "list", "data": data, "model": model,
                         "usage": {"prompt_tokens": n, "total_tokens": n}})
