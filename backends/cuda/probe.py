"""Is there a usable CUDA device? Answered without importing numba.cuda when no driver exists, so
CPU-only machines never load the CUDA modules."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

# the simulator reports no memory of its own: pretend to a small card so sizing logic runs
_SIM_TOTAL_BYTES = 8 * 2**30


@dataclass
class DeviceInfo:
    """What probe() found; `reason` says why a device is not usable (empty when it is)."""

    usable: bool
    reason: str = ""
    name: str = ""
    free_bytes: int = 0
    total_bytes: int = 0
    simulated: bool = False

    def describe(self) -> str:
        if not self.usable:
            return f"no usable CUDA device: {self.reason}"
        sim = " (NUMBA_ENABLE_CUDASIM simulator)" if self.simulated else ""
        return (f"CUDA device {self.name}{sim}: {self.free_bytes / 2**30:.1f} GiB free of "
                f"{self.total_bytes / 2**30:.1f} GiB")


def simulator_enabled() -> bool:
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0")


def _driver_present() -> bool:
    name = ctypes.util.find_library("cuda")
    for lib in filter(None, (name, "libcuda.so.1", "libcuda.so")):
        try:
            ctypes.CDLL(lib)
            return True
        except OSError:
            continue
    return False


def probe() -> DeviceInfo:
    """Find device 0 and its free memory; never raises."""
    if not simulator_enabled() and not _driver_present():
        return DeviceInfo(False, "no NVIDIA driver (libcuda) on this machine")
    try:
        from numba import cuda
    except Exception as e:  # numba-cuda missing or broken
        return DeviceInfo(False, f"numba-cuda is not importable ({e}); pip install 'edged[cuda]'")
    if simulator_enabled():
        return DeviceInfo(True, name="simulator", free_bytes=_SIM_TOTAL_BYTES,
                          total_bytes=_SIM_TOTAL_BYTES, simulated=True)
    try:
        if not cuda.is_available():
            return DeviceInfo(False, "the CUDA driver reports no usable device")
        dev = cuda.get_current_device()
        free, total = cuda.current_context().get_memory_info()
        name = dev.name.decode() if isinstance(dev.name, bytes) else str(dev.name)
        return DeviceInfo(True, name=name, free_bytes=int(free), total_bytes=int(total))
    except Exception as e:  # driver/toolkit mismatch, no device, ...
        return DeviceInfo(False, f"CUDA initialisation failed: {e}")
