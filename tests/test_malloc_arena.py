"""edged's command line leaves glibc one malloc arena, whatever threads allocate afterwards."""

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="mallopt(M_ARENA_MAX) and malloc_info are glibc's")


def _arenas(mode: str, env_extra: dict | None = None) -> int:
    """Arenas after four threads allocate; mode "cli" imports edged.cli first. malloc_info's XML
    has one <heap nr=...> per arena."""
    code = r"""
import ctypes, sys, tempfile, threading
if sys.argv[1] == "cli":
    import edged.cli
import numpy as np

def work():
    for _ in range(50):
        np.ones(1 << 15).sum()

ts = [threading.Thread(target=work) for _ in range(4)]
for t in ts:
    t.start()
for t in ts:
    t.join()
libc = ctypes.CDLL(None)
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
libc.malloc_info.argtypes = (ctypes.c_int, ctypes.c_void_p)
libc.fclose.argtypes = (ctypes.c_void_p,)
with tempfile.NamedTemporaryFile(suffix=".xml") as f:
    fp = libc.fopen(f.name.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(open(f.name).read().count("<heap nr="))
"""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"} | (env_extra or {})
    out = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_the_cli_leaves_one_arena_where_threads_would_make_more():
    assert _arenas("plain") > 1  # the default this guards against: an arena per allocating thread
    assert _arenas("cli") == 1


def test_an_explicit_malloc_arena_max_is_the_users():
    assert _arenas("cli", {"MALLOC_ARENA_MAX": "8"}) > 1
