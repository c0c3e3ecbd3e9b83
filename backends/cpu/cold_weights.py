"""Weights as a decode step reads them: from DRAM. A model's weights far exceed the last-level cache
and each is read once per step, so a kernel timed over a few small tensors that stay cached is
timed in the wrong regime (prefetching, for one, only shows its worth on cold reads). Used by the
kernel tuner (tuning.py) and `edged bench --kernels`."""

from dataclasses import replace

from edged.quant.tensor import QTensor

MAX_COPIES = 256  # cap on the tensors of one shape cycled through


def last_level_cache_bytes() -> int:
    """Size of the largest CPU cache (sysfs), or 32 MiB when the OS does not say."""
    import glob

    best = 0
    for path in glob.glob("/sys/devices/system/cpu/cpu0/cache/index*/size"):
        try:
            txt = open(path).read().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(txt[-1:], 1)
        digits = txt.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or 32 << 20


def dram_copies(ws, cache_bytes: int | None = None) -> list:
    """ws (a QTensor, or a list of QTensors of one shape) and copies of them in turn, totalling at
    least twice the last-level cache (at most MAX_COPIES tensors; ws alone when that large already):
    cycling through them makes every call stream its weights from DRAM."""
    ws = [ws] if isinstance(ws, QTensor) else list(ws)
    need = 2 * (cache_bytes or last_level_cache_bytes())
    have = sum(w.data.nbytes for w in ws)
    out = list(ws)
    i = 0
    while have < need and len(out) < MAX_COPIES:
        w = ws[i % len(ws)]
        out.append(replace(w, data=w.data.copy()))
        have += w.data.nbytes
        i += 1
    return out
