"""What Ollama's model routes report, from the server's model manager and the model store:
/api/tags entries, /api/ps entries (memory, GPU share, expiry), /api/show details, and the
load / unload requests (an empty prompt, with keep_alive 0 to unload)."""

from __future__ import annotations

import asyncio
import functools
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path

from edged.server.errors import bad_request
from edged.server.ollama_responses import timestamp

FOREVER_S = 292 * 365 * 86400  # Ollama's "never expires" is now + the largest Go duration (~292 years)
UNLOAD_WAIT_S = 30.0  # an unload request waits this long for the model's memory to be returned
_BIG_ARRAY = 64  # model_info leaves out longer arrays (the vocabulary), as Ollama's non-verbose show


@dataclass(frozen=True)
class Facts:
    """One model's identity for Ollama's listings."""

    size: int
    modified_at: str
    digest: str
    architecture: str
    parameters: int
    quantization: str
    context_length: int


def human_parameters(n: int) -> str:
    """Ollama's parameter_size: "8.0B", "135M", "134.52M", "27K"."""
    for scale, unit, decimals in ((1e9, "B", 1), (1e6, "M", 2)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == math.floor(v) else f"{v:.{decimals}f}{unit}"
    return f"{n / 1e3:.0f}K" if n >= 1e3 else str(n)


def details(f: Facts) -> dict:
    return {"parent_model": "", "format": "gguf", "family": f.architecture,
            "families": [f.architecture], "parameter_size": human_parameters(f.parameters),
            "quantization_level": f.quantization}


def _manifest(store, slot):
    """The store entry behind a slot, if it has one."""
    if store is None:
        return None
    from edged.store import StoreError, is_store_name

    for name in sorted(slot.ids()):
        if is_store_name(name) and ":" in name:
            try:
                return store.get(name)
            except StoreError:
                continue
    return None


@functools.lru_cache(maxsize=32)
def _file_manifest(path: str, size: int, mtime: float):
    """A model file outside the store described as a store entry would be (validated once per
    version of the file), so both kinds report the same facts."""
    from dataclasses import fields

    from edged.store.gguf_facts import validated_facts
    from edged.store.manifest import Manifest

    f = validated_facts(Path(path))
    known = {x.name for x in fields(Manifest)}
    return Manifest(**{k: v for k, v in f.items() if k in known}, name=Path(path).stem, files=(),
                    size=size, source={"kind": "file", "path": path}, created=timestamp(mtime))


def facts(store, slot) -> Facts:
    m = _manifest(store, slot)
    digest = m.files[0]["sha256"] if m is not None else ""
    if m is None:
        st = os.stat(slot.model_path)
        m = _file_manifest(str(slot.model_path), st.st_size, st.st_mtime)
    return Facts(m.size, m.created, digest, m.architecture, m.parameters, m.quantization,
                 m.context_length)


def tag_entry(store, slot) -> dict:
    f = facts(store, slot)
    return {"name": slot.model_name, "model": slot.model_name, "modified_at": f.modified_at,
            "size": f.size, "digest": f.digest, "details": details(f)}


def tags(state) -> list[dict]:
    """/api/tags: every model the server can serve (loaded or not)."""
    return [tag_entry(state.models.store, s) for s in state.models.listed()]


# -- running models ------------------------------------------------------------------------------

def device_bytes(slot) -> int:
    """Bytes the model holds on a GPU: its offloaded layers' weights and their share of the KV
    pools, the output projection when it runs there; 0 on the CPU."""
    engine = slot.engine
    model = getattr(engine, "model", None)
    host, layer_ops = getattr(model, "host_ops", None), getattr(model, "layer_ops", None)
    if model is None or layer_ops is None:
        return 0
    on_gpu = [i for i, ops in enumerate(layer_ops) if ops is not host]
    total = sum(model.layer_bytes(i) for i in on_gpu)
    if getattr(model, "output_ops", host) is not host:
        total += model.output_bytes()
    kv = slot.estimate.kv if slot.estimate is not None else 0
    return total + (kv * len(on_gpu) // len(layer_ops) if layer_ops else 0)


def expires_at(slot) -> str:
    """Wall-clock expiry: while idle its deadline, while busy now + its keep_alive; pinned models
    and keep_alive -1 never expire."""
    now = time.time()
    if slot.expires_at is not None:
        return timestamp(now + max(0.0, slot.expires_at - time.monotonic()))
    ka = slot.keep_alive
    if slot.pinned or ka == math.inf:
        return timestamp(now + FOREVER_S)
    return timestamp(now + ka)


def ps(state) -> list[dict]:
    """/api/ps: the loaded models, most recently used first."""
    out = []
    store = state.models.store
    for s in sorted(state.models.loaded(), key=lambda s: -s.last_used):
        engine = s.engine
        if engine is None:  # unloaded meanwhile
            continue
        f = facts(store, s)
        size = s.estimate.total if s.estimate is not None else f.size
        out.append({"name": s.model_name, "model": s.model_name, "size": size, "digest": f.digest,
                    "details": details(f), "expires_at": expires_at(s),
                    "size_vram": min(size, device_bytes(s)), "context_length": engine.max_len})
    return out


# -- show ----------------------------------------------------------------------------------------

def _info_value(v):
    if isinstance(v, (str, int, float, bool)):
        return v
    if isinstance(v, list):
        return v if len(v) <= _BIG_ARRAY else []
    return []  # numpy arrays: the vocabulary's scores and types


def show(state, model: str) -> dict:
    """/api/show: details, the GGUF's metadata as model_info, the chat template, capabilities."""
    from edged.quant import load_gguf
    from edged.toolcall import detect_reasoning

    slot = state.models.resolve(model)
    f = facts(state.models.store, slot)
    with load_gguf(slot.model_path) as gf:
        info = {k: _info_value(v) for k, v in gf.metadata.items() if k != "tokenizer.chat_template"}
        template = gf.get_str("tokenizer.chat_template", default="") or ""
    info["general.parameter_count"] = f.parameters
    if slot.chat is not None:  # the template requests render: --chat-template or the fallback
        template = slot.chat.source
    capabilities = ["completion", "tools"]  # tools: every template (the generic format otherwise)
    if detect_reasoning(template):
        capabilities.append("thinking")
    return {"modelfile": f"# Modelfile generated by edged\nFROM {slot.model_path}\n",
            "parameters": "", "template": template, "details": details(f), "model_info": info,
            "capabilities": capabilities, "modified_at": f.modified_at}


# -- unload --------------------------------------------------------------------------------------

async def unload(state, model: str | None) -> str:
    """Unload `model` now (once requests still using it end), as keep_alive 0 does; a model given
    to `edged serve` as MODEL stays loaded."""
    mgr = state.models
    slot = mgr.resolve(model)
    if slot.pinned:
        raise bad_request(f"'{slot.model_name}' was given to `edged serve` as MODEL and stays "
                          "loaded; serve the store (no MODEL) to load and unload models",
                          "keep_alive")
    if slot.engine is None:
        return slot.model_name
    hold = mgr.hold(slot)
    hold.keep_alive = 0.0
    mgr.release(hold)  # keep_alive 0: the manager unloads it once idle
    await asyncio.to_thread(slot.unloaded.wait, UNLOAD_WAIT_S)
    return slot.model_name
