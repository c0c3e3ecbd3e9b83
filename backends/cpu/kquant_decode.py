"""K-quant and IQ4_XS rows decoded once for the gemm (decode_row): unsigned bytes u and float
scales s and biases c in memory, w_e = s[e // 32 or e // 16] · u_e + c[same], that the gemm tile
(kquant_gemm_tile.tile_dot) then multiplies by every token tile.
"""

import numba as nb
from llvmlite import ir
from numba.core import types
from numba.extending import intrinsic

from edged.backends.cpu.kquant_unpack import TYPES
from edged.backends.cpu.vector_ir import I64, as_i64, base_ptr, emit_switch, ints, is_arr, loop, store


def _emit_decode_row(context, builder, signature, args, quants, scales, nscales):
    """One row of superblocks: per superblock the (s, c) vectors (nscales floats each) and the 4
    64-byte chunks of u, each stored once."""
    st = signature.args
    ptr = lambda k: base_ptr(context, builder, st[k], args[k], as_i64(context, builder, args[k + 1], st[k + 1]))  # noqa: E731
    wp, up, sp, cp = ptr(0), ptr(3), ptr(5), ptr(7)
    sbs = as_i64(context, builder, args[9], st[9])

    def body(i, _):
        bp = builder.gep(wp, [builder.mul(i, sbs)])
        ub = builder.gep(up, [builder.mul(i, ir.Constant(I64, 256))])
        fo = builder.mul(i, ir.Constant(I64, 4 * nscales))
        sv, cv = scales(builder, bp)
        store(builder, sv, sp, fo)
        store(builder, cv, cp, fo)
        for j in range(4):
            store(builder, quants(builder, bp, j), ub, 64 * j)
        return []

    loop(builder, as_i64(context, builder, args[2], st[2]), body, [])


def _emit_for(kind, context, builder, signature, args):
    _, _, quants, scales, family = TYPES[kind]
    _emit_decode_row(context, builder, signature, args[1:], quants, scales, 8 if family == "s32" else 16)


@intrinsic
def _decode_row(typingctx, kind, w, woff, nsb, u, uoff, s, soff, c, coff, sbs):
    if not (is_arr(w, types.uint8) and is_arr(u, types.uint8) and is_arr(s, types.float32)
            and is_arr(c, types.float32) and ints(kind, woff, nsb, uoff, soff, coff, sbs)):
        return None
    sig = types.void(kind, w, woff, nsb, u, uoff, s, soff, c, coff, sbs)

    def codegen(context, builder, signature, args):
        sub = signature.replace(args=signature.args[1:])
        emit_switch(builder, args[0], {k: (lambda k=k: _emit_for(k, context, builder, sub, args)) for k in TYPES})
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def decode_row(kind, w, woff, nsb, u, uoff, s, soff, c, coff, sbs):
    """One row of type `kind` (a KIND_* value; nsb superblocks from byte woff of w, sbs bytes
    apart: GGUF's layout or kquant_pairs' pair layout) -> unsigned
    weights u uint8 [256·nsb] from element uoff, and per-32 (Q4_K, Q5_K, IQ4_XS: [8·nsb]) or per-16
    (Q6_K, Q3_K, Q2_K: [16·nsb]) float32 scales s from soff and biases c from coff, with
    w_e = s · u_e + c. u holds: Q4_K the 4-bit q, c = -dmin·min; Q5_K the 5-bit q; IQ4_XS the
    codebook level + 128, c = -128·s; Q6_K q + 32, c = -32·s; Q3_K q + 4, c = -4·s; Q2_K q,
    s = d·scale, c = -dmin·min."""
    _decode_row(kind, w, woff, nsb, u, uoff, s, soff, c, coff, sbs)
