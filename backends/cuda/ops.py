"""The CUDA backend's public op set: the CPU backend's ops (edged.backends.base) on numba.cuda
device arrays (float32 unless stated), plus transfers and weight upload.

    upload(a) -> device array; to_host(d) -> np.ndarray; device_memory() -> (free, total) bytes
    upload_matrix(w: QTensor) -> DeviceMatrix(name, qtype, shape=(m, k), rows: device uint8 [m, row_bytes])
    check_supported(qtype) -> None                     ValueError naming a type without a kernel
    matmul(w: DeviceMatrix, x [n, k], *, qx=None) -> [n, m]   (qx = quantize_activations(x) shares one
                                                       int8 quantization between matmuls of the same x)
    embed(w: DeviceMatrix, ids int32 [n]) -> [n, k]
    rms_norm(x [n, d], weight [d], eps, out=None) -> [n, d]
    rope(x [n, h, hd], positions [n], p: RopeParams, out=None) -> [n, h, hd]
    gelu_tanh_mul(gate, up, out=None), silu_mul(gate, up, out=None) -> [n, f];  softcap(x, cap, out=None)
    add(a, b, out=None) (b same shape or a row [d]);  scale(x, s, out=None)
    take_rows(x [n, ...], rows) -> [len(rows), ...];  slice_cols(x [n, c], start, stop) -> [n, stop-start]
    allocate_kv(num_blocks, block_size, n_kv_heads, head_dim, kv_type="f16") -> LayerKV (device k, v [+ q8_0 scales], zeroed)
    store_kv(kv, k [n, kvh, hd], v, slot_mapping int32 [n]) -> None
    prepare_batch(batch) -> Batch with device arrays;  attention(q, kv, batch, scale, window=0, softcap=0.0, sinks=None)

Every op accepts device arrays (host numpy is uploaded for inputs such as ids, positions and
weights); outputs are new device arrays unless `out` is given; no op copies activations to the host.
"""

from edged.backends.cuda.act_quant import quantize_activations
from edged.backends.cuda.activations import add, gelu_tanh_mul, scale, silu_mul, slice_cols, softcap, take_rows
from edged.backends.cuda.attention import allocate_kv, attention, prepare_batch, store_kv
from edged.backends.cuda.embed import embed
from edged.backends.cuda.matmul import check_supported, matmul, supported_types
from edged.backends.cuda.memory import DeviceMatrix, device_memory, to_host, upload, upload_matrix
from edged.backends.cuda.norm_rope import rms_norm, rope

__all__ = [
    "DeviceMatrix", "add", "allocate_kv", "attention", "check_supported", "device_memory", "embed",
    "gelu_tanh_mul", "matmul", "prepare_batch", "quantize_activations", "rms_norm", "rope", "scale",
    "silu_mul", "slice_cols", "softcap", "store_kv", "supported_types", "take_rows", "to_host",
    "upload", "upload_matrix",
]
