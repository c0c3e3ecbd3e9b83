"""CUDA backend: numba-cuda kernels behind the op set of edged.backends.base.

The public op set lives in `edged.backends.cuda.ops` (upload, to_host, upload_matrix, matmul, embed,
rms_norm, rope, gelu_tanh_mul, silu_mul, softcap, add, scale, take_rows, slice_cols, allocate_kv,
store_kv, prepare_batch, attention, device_memory). This package file imports only numpy, so a
probe module beside it can be imported without pulling in numba.cuda.

Kernel modules (one concern each): launch (launch configs, reductions), memory (uploads, DeviceMatrix),
dequant (per-type device decoders), act_quant, matmul (dispatch), matmul_int / matmul_float (kernels),
matmul_layout (their thread layouts and output stores), embed, norm_rope, activations, attention.
Tests run under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1) at tiny sizes; tests/gpu repeats them at
real sizes on a device.
"""

import numpy as _np

# numba-cuda 0.30 registers an overload of np.row_stack, which numpy 2.5 removed: without the alias
# its first kernel compile fails (AttributeError; seen on an H200 image with numpy 2.5.2)
if not hasattr(_np, "row_stack"):
    _np.row_stack = _np.vstack
