"""Loading a model for serving or running: GGUF file, model, tokenizer, chat template, JIT warm-up."""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edged.backends.base import KV_DEFAULT, Batch
from edged.backends.cpu.rows_scan_parallel import rows_scan_parallel
from edged.chat import ChatTemplate
from edged.chat_limits import ChatTemplateError
from edged.model_path import resolve_model_path
from edged.models import ModelError, load_model
from edged.offload import OffloadError, Placement, apply as apply_placement, plan as plan_placement
from edged.progress import Progress
from edged.quant import GGUFFile, load_gguf
from edged.quant.errors import GGUFError
from edged.tokenizer import Tokenizer, TokenizerError

# token counts whose forward passes compile every kernel path (mat-vec and tiled batch)
_WARMUP_SIZES = (1, 17)

# errors whose messages already name the file, key or tensor; other value/arithmetic errors do not
_NAMED_ERRORS = (ModelError, GGUFError, TokenizerError, ChatTemplateError, OffloadError)


@contextmanager
def model_errors(path):
    """The loader's last guard: an arithmetic or value error that escaped the validation while the
    model is built or first run becomes a ModelError naming the file (never a bare ZeroDivisionError)."""
    try:
        yield
    except _NAMED_ERRORS:
        raise
    except (ArithmeticError, ValueError) as e:  # OverflowError, ZeroDivisionError, numpy's ValueErrors
        raise ModelError(f"{path}: the model cannot be built from this file "
                         f"({type(e).__name__}: {e})") from e


def check_vocab(path, tokenizer: Tokenizer, model) -> None:
    """Every token id the tokenizer can produce must have an embedding row (more rows is fine:
    converters pad the embedding)."""
    if tokenizer.vocab_size > model.vocab_size:
        raise ModelError(f"{path}: tokenizer.ggml.tokens has {tokenizer.vocab_size} tokens but "
                         f"token_embd.weight has {model.vocab_size} rows: token ids "
                         f"{model.vocab_size}..{tokenizer.vocab_size - 1} have no embedding")


@dataclass
class LoadedModel:
    path: Path
    gguf: GGUFFile
    model: object
    tokenizer: Tokenizer
    chat: ChatTemplate
    load_s: float
    compile_s: float
    placement: Placement | None = None
    tuning: dict | None = None  # backends/cpu/tuning.py's report (CPU placements)


def warm_up(model, sizes=_WARMUP_SIZES, progress: Progress | None = None) -> float:
    """Run tiny forward passes so every kernel is compiled (or loaded from the on-disk cache)."""
    t0 = time.perf_counter()
    bs = 16
    kv = model.allocate_kv(4, bs)
    for n in sizes:
        model.forward(Batch.single(np.zeros(n, dtype=np.int32), 0, 4, bs), kv)
        if progress is not None:
            progress.advance(1, f"{n}-token pass")
    rows_scan_parallel(np.zeros((1, 1), np.float32))  # the server's compute thread scans big steps' logits
    return time.perf_counter() - t0


def tune_kernels(model, placement: Placement, *, tune: bool = True, quiet: bool = False) -> dict | None:
    """Install the CPU kernels' per-machine choices (backends/cpu/tuning.py), timing the weight
    shapes this CPU has not seen when `tune` (a few seconds, once); CPU placements only."""
    if placement.backend != "cpu":
        return None
    from edged.backends.cpu import tuning

    report = _in_short_lived_thread(tuning.for_model, model, tune=tune)
    if not quiet and report["tuned"]:
        print(f"edged: kernels tuned for this CPU in {report['seconds']:.1f} s ({len(report['tuned'])} "
              f"shape classes, cached in {report['path']})", file=sys.stderr)
    elif not quiet and report.get("deferred"):
        print(f"edged: kernel tuning deferred: {report['deferred']}", file=sys.stderr)
    return report


def _in_short_lived_thread(fn, *args, **kwargs):
    """Run fn in a thread that exits afterwards. OpenMP keeps a spinning worker team per thread
    that ever ran a parallel region; a team left on the main thread halved the engine thread's
    decode speed (32 vs 69 tok/s measured), so start-up work must not leave one behind."""
    out: list = []
    err: list = []

    def run():
        try:
            out.append(fn(*args, **kwargs))
        except BaseException as e:  # re-raised in the caller's thread
            err.append(e)

    t = threading.Thread(target=run, name="edged-warmup")
    t.start()
    t.join()
    if err:
        raise err[0]
    return out[0]


def load(model: str | None = None, *, chat_template: str | None = None, warmup: bool = True,
         quiet: bool = False, backend: str = "auto", gpu_layers=None, kv_tokens=4096,
         batch_tokens: int = 512, kv_type: str = KV_DEFAULT) -> LoadedModel:
    """Resolve, validate and load a model (default: the installed default model).

    backend/gpu_layers: see edged.offload.plan; kv_tokens (as plan takes it, or a function of the model)
    sizes the KV the GPU layers must hold; kv_type: the KV cache's element type (f32, f16, q8_0).
    Prints one line with load and compile times to stderr unless quiet; a progress bar on a TTY.
    """
    path = resolve_model_path(model)
    t0 = time.perf_counter()
    with Progress("loading model", 3) as p, model_errors(path):
        gf = load_gguf(path)
        p.advance(1, "validated GGUF")
        tokenizer = Tokenizer.from_gguf(gf)
        chat = ChatTemplate.from_gguf(gf, override=chat_template)
        p.advance(1, "tokenizer")
        m = load_model(gf)
        check_vocab(path, tokenizer, m)
        m.kv_type = kv_type  # before anything sizes the KV (ValueError for q8_0 with head_dim % 32)
        if callable(kv_tokens):  # sized from the model (e.g. a --kv-memory budget)
            kv_tokens = kv_tokens(m)
        placement = plan_placement(m, backend, gpu_layers, kv_tokens=kv_tokens, batch_tokens=batch_tokens)
        apply_placement(m, placement)
        p.advance(1, "weights mapped" if placement.backend == "cpu" else "weights uploaded")
    load_s = time.perf_counter() - t0
    compile_s = 0.0
    if warmup:
        with Progress("compiling kernels", len(_WARMUP_SIZES)) as p, model_errors(path):
            compile_s = _in_short_lived_thread(warm_up, m, progress=p)
    tuning = tune_kernels(m, placement, tune=warmup, quiet=quiet)  # after warm-up: kernels compiled
    if not quiet:
        print(f"edged: loaded {path.name} ({gf.architecture}) in {load_s:.2f} s; "
              f"kernels ready in {compile_s:.2f} s", file=sys.stderr)
        if placement.backend != "cpu":
            print(f"edged: {placement.describe()}", file=sys.stderr)
    return LoadedModel(path, gf, m, tokenizer, chat, load_s, compile_s, placement, tuning)
