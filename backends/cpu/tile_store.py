"""A 4-row × 16-token tile's results into the gemm output: store_quad writes y[t, col : col + 4]
for each token t from the tile's [4 rows, 16 tokens] block, four floats a token (a 4 × 16
transpose in registers). Shared by the legacy (legacy_gemm_quad) and K-quant (kquant_gemm_tile)
gemms, whose tiles lay out their results alike."""

import numba as nb
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.vector_ir import F32, I32, I64

ROWS, TOKENS = 4, 16  # the tile: rows × tokens, row r's tokens at 16·r


@intrinsic
def _store_quad(typingctx, acc, y, t0, nt, col):
    if not (vir.is_arr(acc, types.float32) and acc.ndim == 1 and vir.is_arr(y, types.float32) and y.ndim == 2
            and vir.ints(t0, nt, col)):
        return None
    sig = types.void(acc, y, t0, nt, col)

    def codegen(context, b, signature, args):
        at = signature.args
        c64 = lambda v: ir.Constant(I64, v)  # noqa: E731
        v16f, v4f = ir.VectorType(F32, TOKENS), ir.VectorType(F32, ROWS)
        idx = lambda ix: ir.Constant(ir.VectorType(I32, len(ix)), ix)  # noqa: E731
        ap = vir.f32_ptr(context, b, at[0], args[0])
        rows = [b.load(b.bitcast(b.gep(ap, [ir.Constant(I32, TOKENS * r)]), v16f.as_pointer()), align=4) for r in range(ROWS)]
        # [4 rows, 16 tokens] -> 4 vectors of [4 tokens, 4 rows]: interleave row pairs, then the pairs
        pair = [[b.shuffle_vector(rows[2 * p], rows[2 * p + 1], idx([h * 8 + k // 2 + TOKENS * (k % 2) for k in range(16)]))
                 for h in (0, 1)] for p in (0, 1)]  # pair[p][h]: tokens 8h.., rows 2p, 2p + 1 alternating
        quads = []
        for h in (0, 1):
            for q in (0, 1):  # tokens 8h + 4q .. + 3
                quads.append(b.shuffle_vector(pair[0][h], pair[1][h], idx(
                    [2 * (4 * q + k // 4) + k % 2 + (TOKENS if k % 4 >= 2 else 0) for k in range(16)])))
        yarr = context.make_array(at[1])(context, b, args[1])
        m = vir.as_i64(context, b, b.extract_value(yarr.shape, 1), types.intp)
        yp = b.bitcast(yarr.data, F32.as_pointer())
        t0, nt, col = (vir.as_i64(context, b, args[k], at[k]) for k in (2, 3, 4))
        for t in range(TOKENS):
            v = b.shuffle_vector(quads[t // 4], ir.Constant(v16f, ir.Undefined), idx([4 * (t % 4) + i for i in range(ROWS)]))
            with b.if_then(b.icmp_signed("<", c64(t), nt)):
                b.store(v, b.bitcast(b.gep(yp, [b.add(b.mul(b.add(t0, c64(t)), m), col)]), v4f.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def store_quad(acc, y, t0, nt, col):
    """y[t0 + t, col : col + 4] = acc[16·r + t] for r < 4 and t < nt (acc float32 [64], y float32
    [n, m]): four floats a token, where a scalar copy cost the legacy gemm ~20% (docs/kernels.md)."""
    _store_quad(acc, y, t0, nt, col)
