"""Every CUDA kernel compiles for a real GPU (sm_90 PTX) — no GPU needed, only a CUDA toolkit's
libNVVM and libdevice; runs in a subprocess because this session's numba.cuda is the simulator."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.backends.cuda.ptx_compile import find_libdevice

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.slow
def test_every_kernel_compiles_to_ptx():
    if find_libdevice() is None:
        pytest.skip("no CUDA toolkit (libdevice) on this machine")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    res = subprocess.run([sys.executable, str(ROOT / "tests/backends/cuda/ptx_compile.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    if res.returncode == 2:
        pytest.skip(res.stderr.strip())
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
