"""Fuzz targets: pure functions over one input that may raise only the project's typed errors.

load_path(data): GGUF bytes -> validation, tokenizer, chat template, model build, one 3-token forward
pass; non-finite logits from a file that loaded are a finding (NonFiniteLoad), as is any other error.
request_body(route, data): raw bytes POSTed to the real app in process (a tiny gemma3 model);
a 5xx or an exception escaping the app is a finding (ServerFault).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from edged.backends.base import Batch
from edged.chat_limits import ChatTemplateError
from edged.loader import load, model_errors
from edged.models import ModelError
from edged.offload import OffloadError
from edged.quant.errors import GGUFError
from edged.tokenizer import TokenizerError

# what the load path may raise: each names the file, key or tensor (edged/loader.py _NAMED_ERRORS)
LOAD_ERRORS = (GGUFError, ModelError, TokenizerError, ChatTemplateError, OffloadError)
_SCRATCH = Path(os.environ.get("EDGED_FUZZ_DIR") or tempfile.mkdtemp(prefix="edged-fuzz-"))


class NonFiniteLoad(Exception):
    """A file that loaded gave NaN or inf logits: the validation let a broken model through."""


class ServerFault(Exception):
    """The app answered a 5xx (or let an exception escape) for a request body."""


def load_path(data: bytes) -> int:
    """Load `data` as a model file the way `edged serve` does and run one 3-token forward pass
    over the chat template's rendering; returns the model's vocab size on a clean load."""
    path = _SCRATCH / f"input-{os.getpid()}.gguf"
    path.write_bytes(data)
    lm = load(str(path), warmup=False, quiet=True, backend="cpu")
    with model_errors(path):
        text = lm.chat.render([{"role": "user", "content": "hi"}])
        ids = (lm.tokenizer.encode(text) + [0, 0, 0])[:3]
        kv = lm.model.allocate_kv(4, 16)  # as edged.loader.warm_up
        logits = lm.model.forward(Batch.single(np.asarray(ids), 0, 4, 16, logits_indices=[0, 1, 2]), kv)
    if not np.isfinite(logits).all():
        raise NonFiniteLoad(f"{lm.gguf.architecture}: logits not finite for tokens {ids}")
    return lm.model.vocab_size


# -- request bodies -----------------------------------------------------------------------------

# Every POST route of the app; /api/pull only through its parser (a catalogue name would download).
POST_ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
               "/tokenize", "/detokenize", "/api/chat", "/api/generate", "/api/show",
               "/v1/messages", "/v1/messages/count_tokens")
PARSER_ONLY = ("/api/pull",)
_app = {}


def _client():
    """One in-process TestClient over create_app with a tiny gemma3 model (2048-token context)."""
    if "client" not in _app:
        from starlette.testclient import TestClient

        from edged.server.app import create_app
        from edged.server.config import ServerConfig
        from edged.server.lifecycle import ServerState
        from tests.helpers.tiny_models import write_tiny_model

        path = write_tiny_model(_SCRATCH / "server-tiny.gguf", "gemma3", context=2048)
        lm = load(str(path), warmup=False, quiet=True, backend="cpu")
        state = ServerState(ServerConfig(model=str(path), ctx=2048, max_seqs=4, block_size=16))
        app = create_app(state, load_in_background=False)
        state.attach(lm.model, lm.tokenizer, lm.chat, str(path))  # real kernels: embeddings need them
        client = TestClient(app, base_url="http://localhost", raise_server_exceptions=True)
        client.__enter__()
        _app["client"], _app["model"] = client, path.name
    return _app["client"]


def served_model() -> str:
    _client()
    return _app["model"]


def request_body(route: str, data: bytes) -> int:
    """POST `data` to `route`; returns the status. A 5xx or an escaping exception is ServerFault."""
    if route in PARSER_ONLY:
        return _parse_only(route, data)
    try:
        r = _client().post(route, content=data, headers={"content-type": "application/json"})
        if r.headers.get("content-type", "").startswith(("text/event-stream", "application/x-ndjson")):
            body = r.read()  # a stream's error events count too
            if any(k in body for k in (b'"server_error"', b'"internal_error"', b'"api_error"')):
                raise ServerFault(f"{route}: {r.status_code} stream error event: {body[-400:]!r}")
    except ServerFault:
        raise
    except Exception as e:  # raise_server_exceptions: anything the app did not answer itself
        raise ServerFault(f"{route}: exception escaped the app: {type(e).__name__}: {e}") from e
    if r.status_code >= 500:
        raise ServerFault(f"{route}: {r.status_code} {r.text[:400]}")
    return r.status_code


def _parse_only(route: str, data: bytes) -> int:
    """The route's own parser on the decoded body: only APIError with a 4xx may come out."""
    from edged.server import ollama_schemas
    from edged.server.errors import APIError

    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return 400  # not JSON: the app's _json_body answers 400 before the parser
    try:
        ollama_schemas.PULL.read(body)
    except APIError as e:
        if e.status >= 500:
            raise ServerFault(f"{route}: parser raised a {e.status}: {e}") from e
        return e.status
    return 200
