"""glibc malloc settings that keep a step's freed memory for the next step.

glibc gives a heap's free top back to the kernel past a trim threshold, frees a thread's emptied
heap, and maps blocks above an mmap threshold afresh each time; the thresholds move with the sizes
freed. A 512-token prefill's temporaries were thus faulted in anew at every step (23,500 minor
faults a prefill on Gemma 3 270M, 114,000 on the synthetic MoE; docs/SERVER.md, "Freed memory").
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3  # glibc's malloc.h
MMAP_THRESHOLD = 32 << 20  # glibc's largest: only blocks above it are mapped for themselves
TRIM_THRESHOLD = 1 << 30  # a heap keeps up to this much free memory at its top
TOP_PAD = 64 << 20  # a thread heap whose neighbour has less free room than this is not freed
_USER_SETTINGS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Set the three thresholds (fixed, no longer moving) unless the environment sets malloc's
    own; True if glibc took them. Not glibc (musl, macOS): False, nothing changed."""
    if not sys.platform.startswith("linux") or any(v in os.environ for v in _USER_SETTINGS) \
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1, mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1,
                mallopt(M_TOP_PAD, TOP_PAD) == 1])
