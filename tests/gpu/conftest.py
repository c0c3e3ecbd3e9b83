"""Device tests: the simulator tests' checks at real sizes, plus the default model's tensors.

Skipped unless numba.cuda sees a real CUDA device (not the simulator). Run them in their own
pytest process (`pytest tests/gpu`): a session that ran tests/backends/cuda first has the
simulator loaded, and these tests then skip.
"""

import edged  # noqa: F401  (numba settings before numba is imported)
import pytest


def _real_device() -> str | None:
    """None when a real device is usable, else why not."""
    try:
        from numba import cuda
    except Exception as e:  # pragma: no cover - numba-cuda missing or broken
        return f"numba.cuda cannot be imported: {e}"
    if "simulator" in getattr(cuda.to_device, "__module__", ""):
        return "numba.cuda is the simulator in this session (run tests/gpu in its own pytest process)"
    try:
        if not cuda.is_available():
            return "no CUDA device"
    except Exception as e:  # pragma: no cover
        return f"CUDA unavailable: {e}"
    return None


_WHY = _real_device()


@pytest.fixture(autouse=True)
def _need_device():
    if _WHY is not None:
        pytest.skip(_WHY)
