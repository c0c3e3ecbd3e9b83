"""One glibc malloc arena for the whole process, set before any other thread allocates.

With an arena per thread, glibc gave the compute thread's heaps back to the kernel after each
large step, so every 512-token prefill faulted its ~90 MB of temporaries in again (docs/SERVER.md,
"One malloc arena"). One arena keeps the freed memory for the next step.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_ARENA_MAX = -8  # glibc's malloc.h


def use_one_arena() -> bool:
    """mallopt(M_ARENA_MAX, 1) unless MALLOC_ARENA_MAX already says otherwise; True if it took.
    Has effect only before a second thread first allocates; not glibc (musl, macOS): False."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return mallopt(M_ARENA_MAX, 1) == 1
