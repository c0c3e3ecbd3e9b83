"""A stand-in "device" backend for placement tests: the CPU kernels, but every array it owns is a
`DeviceArray` and every op refuses host arrays, so a missing transfer at a backend boundary fails
loudly. Counts uploads/downloads of activations to check boundaries are crossed once per step."""

from dataclasses import fields, is_dataclass, replace
from types import SimpleNamespace

import numpy as np

import edged.backends.cpu as cpu
from edged.backends.base import Batch, LayerKV


class DeviceArray(np.ndarray):
    """An array "in device memory"."""


class DeviceMatrix:
    def __init__(self, w):
        self.w = w
        self.name, self.qtype, self.shape = w.name, w.qtype, w.shape


def _dev(a):
    return np.ascontiguousarray(a).view(DeviceArray)


def _host_view(a, what):
    """The CPU kernels' view of a device value; TypeError for a host array that was not uploaded."""
    if isinstance(a, DeviceArray):
        return a.view(np.ndarray)
    if isinstance(a, DeviceMatrix):
        return a.w
    if isinstance(a, np.ndarray) and a.dtype == np.float32:
        raise TypeError(f"host array passed to the device backend as {what}")
    if isinstance(a, (LayerKV, Batch)):
        return replace(a, **{f.name: _host_view(getattr(a, f.name), f.name) for f in fields(a)
                             if isinstance(getattr(a, f.name), np.ndarray)})
    return a


def make_fake_device(unsupported=()):
    """A fresh fake backend namespace with its own transfer counters."""
    ns = SimpleNamespace(uploads=0, downloads=0, batches=0)

    def wrap(name):
        fn = getattr(cpu, name)

        def op(*args, **kwargs):
            args = [_host_view(a, f"{name} arg {i}") for i, a in enumerate(args)]
            kwargs = {k: _host_view(v, f"{name} {k}") for k, v in kwargs.items()}
            out = fn(*args, **kwargs)
            return _dev(out) if isinstance(out, np.ndarray) else out
        return op

    for name in ("matmul", "embed", "rms_norm", "rope", "gelu_tanh_mul", "silu_mul", "softcap", "add",
                 "scale", "store_kv", "attention", "take_rows", "slice_cols"):
        setattr(ns, name, wrap(name))

    def add(a, b, out=None):  # in place on the device array itself
        res = cpu.add(_host_view(a, "add a"), _host_view(b, "add b"))
        if out is not None:
            out[...] = res
            return out
        return _dev(res)

    def scale(x, s, out=None):
        res = cpu.scale(_host_view(x, "scale x"), s)
        if out is not None:
            out[...] = res
            return out
        return _dev(res)

    def upload(a):
        assert not isinstance(a, DeviceArray), "upload of an array already on the device"
        if np.asarray(a).dtype == np.float32:
            ns.uploads += 1
        return _dev(a)

    def to_host(a):
        assert isinstance(a, DeviceArray), "to_host of a host array"
        ns.downloads += 1
        return np.array(a.view(np.ndarray))

    def prepare_batch(batch):
        ns.batches += 1
        return batch  # int metadata: the kernels read it as-is

    def allocate_kv(*a):
        kv = cpu.allocate_kv(*a)
        return replace(kv, **{f.name: _dev(getattr(kv, f.name)) for f in fields(kv) if getattr(kv, f.name) is not None})

    def check_supported(qtype):
        if qtype in unsupported:
            raise ValueError(f"fake device has no kernel for {qtype.name}")

    ns.add, ns.scale, ns.upload, ns.to_host, ns.prepare_batch = add, scale, upload, to_host, prepare_batch
    ns.allocate_kv, ns.check_supported = allocate_kv, check_supported
    ns.upload_matrix = DeviceMatrix
    return ns


def is_on_device(w) -> bool:
    """Whether a placed weight (QTensor/array, or a dataclass of them) lives on the fake device."""
    if isinstance(w, (DeviceArray, DeviceMatrix)):
        return True
    if is_dataclass(w):
        return all(is_on_device(getattr(w, f.name)) for f in fields(w)
                   if isinstance(getattr(w, f.name), (np.ndarray, DeviceMatrix)) or
                   type(getattr(w, f.name)).__name__ == "QTensor")
    return False
