"""Constrained-decoding costs on a model's vocabulary: LLTokenizer build, per-token mask time
(fill_mask, p50/p99) over realistic generations under a JSON schema (matchers from a
MatcherCache, as the engine gets them), a batch of 8 masks through
MaskComputer, and the logit-mask kernel on full rows. `run()` returns the figures as a dict.

Two drivers per generation: fixed valid documents tokenized with the model's own tokenizer, and
a masked decode of random logits (argmax), which wanders through strings, numbers and arrays.
"""

from __future__ import annotations

import json
import platform
import time

import numpy as np

BENCH_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer", "minimum": 1, "maximum": 99999},
        "customer": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 24},
            "email": {"type": "string", "format": "email"},
            "tier": {"enum": ["free", "pro", "enterprise"]}},
            "required": ["name", "tier"], "additionalProperties": False},
        "items": {"type": "array", "minItems": 1, "maxItems": 4, "items": {
            "type": "object", "properties": {
                "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                "qty": {"type": "integer", "minimum": 1, "maximum": 100},
                "price": {"type": "number", "minimum": 0, "maximum": 10000}},
            "required": ["sku", "qty", "price"], "additionalProperties": False}},
        "paid": {"type": "boolean"},
        "note": {"anyOf": [{"type": "string", "maxLength": 40}, {"type": "null"}]},
    },
    "required": ["id", "customer", "items", "paid"],
    "additionalProperties": False,
}

BENCH_DOCS = [
    {"id": 42, "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "tier": "pro"},
     "items": [{"sku": "ABC-1234", "qty": 2, "price": 19.99}, {"sku": "XYZ-0001", "qty": 1, "price": 250}],
     "paid": True, "note": "Deliver after 5 pm, ring twice."},
    {"id": 7, "customer": {"name": "Zoë Ørsted", "tier": "free"},
     "items": [{"sku": "QRS-9876", "qty": 12, "price": 0.5}], "paid": False, "note": None},
]


def cpu_model() -> str:
    """The CPU's model name (lscpu's "Model name"), from /proc/cpuinfo."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _pct(xs) -> dict:
    a = np.asarray(xs) * 1e3
    return {"n": int(a.size), "p50_ms": float(np.percentile(a, 50)), "p99_ms": float(np.percentile(a, 99)),
            "max_ms": float(a.max()), "mean_ms": float(a.mean())}


def _timed_walk(m, tokens_fn, bitmask, max_steps: int) -> list[tuple[float, float]]:
    """(wall, thread CPU) fill_mask times along one generation; tokens_fn(step) gives the next
    token or None. CPU time excludes waits for a core on a loaded machine (a single mask is
    computed on the calling thread)."""
    times = []
    for step in range(max_steps):
        t0, c0 = time.perf_counter(), time.thread_time()
        m.fill_mask(bitmask, 0)
        times.append((time.perf_counter() - t0, time.thread_time() - c0))
        tok = tokens_fn(step, bitmask)
        if tok is None:
            break
        if not m.consume(tok):  # a bench document off its schema, or a mask that let a bad token by
            raise RuntimeError(f"token {tok} rejected at step {step}: {m.error}")
        if m.is_stopped():
            break
    return times


def _mask_times(lltok, encode, schema, n_sampled: int, seed: int) -> list[tuple[float, float]]:
    from edged.backends.cpu.logit_mask import apply_token_bitmask
    from edged.structured import MatcherCache, allocate_bitmask, schema_constraint

    c = schema_constraint(schema, "json_schema")
    cache = MatcherCache(lltok)  # as the engine: compiled once, each generation a copy
    new_matcher = lambda c, _lltok: cache.matcher(c)  # noqa: E731
    bm = allocate_bitmask(1, lltok.vocab_size)
    times: list[tuple[float, float]] = []
    for doc in BENCH_DOCS:
        ids = encode(json.dumps(doc, ensure_ascii=False))
        times += _timed_walk(new_matcher(c, lltok), lambda s, _b: ids[s] if s < len(ids) else None, bm, len(ids) + 1)
    rng = np.random.default_rng(seed)
    logits = np.empty((1, lltok.vocab_size), dtype=np.float32)

    def sampled(_step, b):
        logits[0] = rng.standard_normal(lltok.vocab_size, dtype=np.float32)
        apply_token_bitmask(logits, b, [0])
        return int(np.argmax(logits[0]))

    for _ in range(n_sampled):
        times += _timed_walk(new_matcher(c, lltok), sampled, bm, 400)
    return times


def _batch_times(lltok, encode, schema, batch: int) -> list[float]:
    """MaskComputer.compute for `batch` matchers at staggered positions of the same document."""
    from edged.structured import MaskComputer, MatcherCache, schema_constraint

    c = schema_constraint(schema, "json_schema")
    ids = encode(json.dumps(BENCH_DOCS[0], ensure_ascii=False))
    cache = MatcherCache(lltok)
    ms = [cache.matcher(c) for _ in range(batch)]
    for k, m in enumerate(ms):  # spread over the document
        for t in ids[: k * len(ids) // (2 * batch)]:
            m.consume(t)
    mc = MaskComputer(lltok.vocab_size)
    times = []
    try:
        for step in range(len(ids) // 2):
            live = [(r, m) for r, m in enumerate(ms) if not m.is_stopped()]
            t0 = time.perf_counter()
            mc.compute(batch, live)
            times.append(time.perf_counter() - t0)
            for r, m in live:
                pos = r * len(ids) // (2 * batch) + step
                if pos < len(ids):
                    m.consume(ids[pos])
    finally:
        mc.close()
    return times


def _kernel_times(vocab: int, rows: int, repeat: int) -> list[float]:
    from edged.backends.cpu.logit_mask import apply_token_bitmask

    rng = np.random.default_rng(0)
    bm = rng.integers(-(2**31), 2**31, size=(rows, (vocab + 31) // 32), dtype=np.int64).astype(np.int32)
    base = rng.standard_normal((rows, vocab)).astype(np.float32)
    apply_token_bitmask(base.copy(), bm)  # compile / load from cache
    times = []
    for _ in range(repeat):
        x = base.copy()
        t0 = time.perf_counter()
        apply_token_bitmask(x, bm)
        times.append(time.perf_counter() - t0)
    return times


def run(model_path=None, schema=None, n_sampled: int = 4, batch: int = 8, kernel_repeat: int = 200,
        seed: int = 0) -> dict:
    """The figures (times in ms) on the model at `model_path` (default: the default model)."""
    from edged.model_path import resolve_model_path
    from edged.quant import load_gguf
    from edged.structured import build_lltokenizer
    from edged.tokenizer import Tokenizer

    path = resolve_model_path(None if model_path is None else str(model_path))
    tok = Tokenizer.from_gguf(load_gguf(path))
    t0 = time.perf_counter()
    lltok = build_lltokenizer(tok)
    build_s = time.perf_counter() - t0
    schema = schema or BENCH_SCHEMA
    encode = lltok.tokenize_str
    mask = np.asarray(_mask_times(lltok, encode, schema, n_sampled, seed))
    return {
        "cpu": cpu_model(), "model": str(path), "vocab": lltok.vocab_size,
        "lltokenizer_build_s": build_s,
        "fill_mask_per_token_wall": _pct(mask[:, 0]),
        "fill_mask_per_token_cpu": _pct(mask[:, 1]),
        f"mask_batch{batch}_per_step": _pct(_batch_times(lltok, encode, schema, batch)),
        "kernel_1row": _pct(_kernel_times(lltok.vocab_size, 1, kernel_repeat)),
        f"kernel_{batch}rows": _pct(_kernel_times(lltok.vocab_size, batch, kernel_repeat // 4)),
    }
