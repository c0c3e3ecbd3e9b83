"""SIMD primitives the integer matmul kernels need and LLVM will not find on its own.

rows_dot8 (gemv, any small n): one raw weight row · every token; each group of 8 blocks is decoded
once, transposed in registers and dotted against activations repacked the same way
(repack_groups8), so one vpdpbusd per 4-byte group sums 8 whole blocks into 8 int32 lanes — no
horizontal sum per block or per token; on VNNI hosts two tokens share each 512-bit vpdpbusd (their
groups side by side in the repacked activations), and a last group of <= 4 blocks serves two
tokens per 256-bit vector. row_tile_dot_raw8 (gemm): one weight row ·
a 16-token tile whose int8 activations are "4-interleaved" ([8 groups][16 tokens][4 bytes]) per
block, giving 16 token lanes. Both add the per-block float terms in one canonical 8-lane order (see
"canonical 8-lane float order" below), so a token's output is bit-identical in gemv and gemm.
On AVX-512 VNNI hosts the block dot is `vpdpbusd`; elsewhere portable LLVM vector IR (zext × sext,
then sums of 4 lanes). The choice is made at compile time from the host's features; Numba's
on-disk cache keys on the CPU name and features, so a cached kernel never runs on a host it was
not built for.
"""

import llvmlite.binding as llvm
import numba as nb
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

TOKENS = 16  # tokens per gemm tile: one 512-bit vector of int32 lanes
GROUPS = 8  # 4-byte groups in a 32-element block

# Read at codegen time; tests set it to False to compile the portable path on a VNNI host.
USE_VNNI = bool(llvm.get_host_cpu_features().get("avx512vnni", False))

_I32 = ir.IntType(32)
_I8 = ir.IntType(8)
_V16I32 = ir.VectorType(_I32, 16)
_V64I8 = ir.VectorType(_I8, 64)


def _byte_ptr(context, builder, arrty, arr, off):
    """i8* to element `off` of a 1-D uint8/int8 array."""
    ary = context.make_array(arrty)(context, builder, arr)
    base = builder.bitcast(ary.data, _I8.as_pointer())
    return builder.gep(base, [off])


def _vnni_block(builder, wp, xp, mask=None):
    """16 lanes of Σ_{32 bytes} w·x with vpdpbusd (w unsigned, broadcast; x signed); each 4-byte
    weight word is first XORed with `mask` (an i32 value) when given."""
    mod = builder.module
    fnty = ir.FunctionType(_V16I32, [_V16I32, _V16I32, _V16I32])
    fn = cgutils.get_or_insert_function(mod, fnty, "llvm.x86.avx512.vpdpbusd.512")
    # four independent accumulator chains: one chain of 8 dependent vpdpbusd is latency-bound
    accs = [ir.Constant(_V16I32, None)] * 4
    for g in range(GROUPS):
        wword = builder.load(builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), _I32.as_pointer()), align=1)
        if mask is not None:
            wword = builder.xor(wword, mask)  # scalar xor, then broadcast
        wvec = builder.insert_element(ir.Constant(_V16I32, ir.Undefined), wword, ir.Constant(_I32, 0))
        wvec = builder.shuffle_vector(wvec, ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16))
        xptr = builder.bitcast(builder.gep(xp, [ir.Constant(_I32, 64 * g)]), _V16I32.as_pointer())
        xvec = builder.load(xptr, align=1)
        accs[g % 4] = builder.call(fn, [accs[g % 4], wvec, xvec])
    return builder.add(builder.add(accs[0], accs[1]), builder.add(accs[2], accs[3]))


def _generic_block(builder, wp, xp, mask=None):
    """Same result in target-independent vector IR."""
    v64i32 = ir.VectorType(_I32, 64)
    acc = ir.Constant(_V16I32, None)
    bcast = ir.Constant(ir.VectorType(_I32, 64), [q for _ in range(16) for q in range(4)])
    for g in range(GROUPS):
        wptr = builder.bitcast(builder.gep(wp, [ir.Constant(_I32, 4 * g)]), ir.VectorType(_I8, 4).as_pointer())
        w4 = builder.load(wptr, align=1)
        w64 = builder.shuffle_vector(w4, ir.Constant(ir.VectorType(_I8, 4), ir.Undefined), bcast)
        if mask is not None:
            w64 = builder.xor(w64, builder.bitcast(builder.shuffle_vector(builder.insert_element(ir.Constant(_V16I32, ir.Undefined), mask, ir.Constant(_I32, 0)), ir.Constant(_V16I32, ir.Undefined), ir.Constant(_V16I32, [0] * 16)), _V64I8))
        xptr = builder.bitcast(builder.gep(xp, [ir.Constant(_I32, 64 * g)]), _V64I8.as_pointer())
        x64 = builder.load(xptr, align=1)
        prod = builder.mul(builder.zext(w64, v64i32), builder.sext(x64, v64i32))
        undef = ir.Constant(v64i32, ir.Undefined)
        for q in range(4):
            lane = builder.shuffle_vector(prod, undef, ir.Constant(_V16I32, [4 * t + q for t in range(16)]))
            acc = builder.add(acc, lane)
    return acc


def _f32_ptr(context, builder, arrty, arr):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(ary.data, ir.FloatType().as_pointer())


# ---------------------------------------------------------------- raw block decoding

# raw block layouts decoded in registers: (block bytes, quants offset, qh offset or -1, min offset or
# -1, nibbles?, bias offset for the symmetric types, 16-entry unsigned codebook or None)
IQ4NL_U8 = tuple(v + 128 for v in (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113))
LAYOUTS = {
    0: (34, 2, -1, -1, False, -128.0, None),  # Q8_0: int8 q, read as q ^ 0x80
    1: (18, 2, -1, -1, True, -8.0, None),  # Q4_0
    2: (20, 4, -1, 2, True, 0.0, None),  # Q4_1: + min
    3: (22, 6, 2, -1, True, -16.0, None),  # Q5_0
    4: (24, 8, 4, 2, True, 0.0, None),  # Q5_1: + min
    5: (18, 2, -1, -1, True, -128.0, IQ4NL_U8),  # IQ4_NL: nibbles index llama.cpp's kvalues_iq4nl (+128)
}


def _splat(builder, val, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _block_u8(builder, blk, layout):
    """<32 x i8> unsigned weight bytes of one raw block at i8* blk."""
    size, qoff, hoff, moff, nib, _, book = layout
    v32i8 = ir.VectorType(_I8, 32)
    if not nib:
        q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, qoff)]), v32i8.as_pointer()), align=1)
        return builder.xor(q, ir.Constant(v32i8, [0x80] * 32))
    v16i8 = ir.VectorType(_I8, 16)
    q = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, qoff)]), v16i8.as_pointer()), align=1)
    lo = builder.and_(q, ir.Constant(v16i8, [15] * 16))
    hi = builder.lshr(q, ir.Constant(v16i8, [4] * 16))
    u = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
    if hoff >= 0:  # fifth bits: bit j of the little-endian u32 qh adds 16 to element j
        if USE_VNNI:  # the 32 bits as a mask register (kmovd), then one zero-masked move
            qh = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, hoff)]), _I32.as_pointer()), align=1)
            hit = builder.bitcast(qh, ir.VectorType(ir.IntType(1), 32))
        else:
            v4i8 = ir.VectorType(_I8, 4)
            qh = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, hoff)]), v4i8.as_pointer()), align=1)
            hb = builder.shuffle_vector(qh, ir.Constant(v4i8, ir.Undefined), ir.Constant(ir.VectorType(_I32, 32), [j // 8 for j in range(32)]))
            hit = builder.icmp_unsigned("!=", builder.and_(hb, ir.Constant(v32i8, [1 << (j % 8) for j in range(32)])), ir.Constant(v32i8, [0] * 32))
        u = builder.or_(u, builder.select(hit, ir.Constant(v32i8, [16] * 32), ir.Constant(v32i8, [0] * 32)))
    if book is not None:  # codebook lookup: vpshufb on x86 AVX-512 hosts, a select chain elsewhere
        if USE_VNNI:
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32i8, [v32i8, v32i8]), "llvm.x86.avx2.pshuf.b")
            u = builder.call(fn, [ir.Constant(v32i8, list(book) * 2), u])
        else:
            out = ir.Constant(v32i8, [book[0]] * 32)
            for i in range(1, 16):
                hit = builder.icmp_unsigned("==", u, ir.Constant(v32i8, [i] * 32))
                out = builder.select(hit, ir.Constant(v32i8, [book[i]] * 32), out)
            u = out
    return u


def _dot32(builder, u, x):
    """<8 x i32> partial sums of u (<32 x i8>, unsigned) · x (<32 x i8>, signed)."""
    v8i32 = ir.VectorType(_I32, 8)
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8i32, [v8i32] * 3), "llvm.x86.avx512.vpdpbusd.256")
        return builder.call(fn, [ir.Constant(v8i32, None), builder.bitcast(u, v8i32), builder.bitcast(x, v8i32)])
    v32i32 = ir.VectorType(_I32, 32)
    prod = builder.mul(builder.zext(u, v32i32), builder.sext(x, v32i32))
    undef = ir.Constant(v32i32, ir.Undefined)
    acc = None
    for q in range(4):
        lane = builder.shuffle_vector(prod, undef, ir.Constant(v8i32, [4 * t + q for t in range(8)]))
        acc = lane if acc is None else builder.add(acc, lane)
    return acc


# ---------------------------------------------------------------- canonical 8-lane float order
#
# Batch invariance needs gemv and gemm to add a row's per-block float terms in one fixed order.
# The order shared by rows_dot8 (gemv) and row_tile_dot_raw8 (gemm):
#   lane j (0..7) = 0.0 + T_j + T_{j+8} + T_{j+16} + ... (blocks b ≡ j mod 8, increasing b),
#   result        = ((L0 + L4) + (L2 + L6)) + ((L1 + L5) + (L3 + L7)),
# with T_b = xd_b · (d_b · s_b + c_b · xs_b). gemv then holds 8 blocks in the 8 lanes of one
# vector (no horizontal sum per block), gemm holds 8 independent accumulators per token lane.


def _tree8_vectors(builder, lanes):
    """The canonical final tree over the 8 lane accumulators (vectors: one lane per token)."""
    a = [builder.fadd(lanes[i], lanes[i + 4]) for i in range(4)]
    return builder.fadd(builder.fadd(a[0], a[2]), builder.fadd(a[1], a[3]))


def _tree8_lanes(builder, v):
    """The same tree over the 8 lanes of one <8 x float> vector -> float."""
    undef = ir.Constant(v.type, ir.Undefined)
    idx = lambda ix: ir.Constant(ir.VectorType(_I32, len(ix)), ix)  # noqa: E731
    a = builder.fadd(builder.shuffle_vector(v, undef, idx([0, 1, 2, 3])), builder.shuffle_vector(v, undef, idx([4, 5, 6, 7])))
    u4 = ir.Constant(a.type, ir.Undefined)
    b = builder.fadd(builder.shuffle_vector(a, u4, idx([0, 1])), builder.shuffle_vector(a, u4, idx([2, 3])))
    return builder.fadd(builder.extract_element(b, ir.Constant(_I32, 0)), builder.extract_element(b, ir.Constant(_I32, 1)))


def _tile_sum8(builder, nblk, term):
    """Σ_b term(b) (<16 x float> per block) in the canonical 8-lane order, for b < nblk."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    accs = [cgutils.alloca_once_value(builder, ir.Constant(v16f, None)) for _ in range(8)]
    eight = ir.Constant(nblk.type, 8)
    ngroup = builder.udiv(nblk, eight)
    with cgutils.for_range(builder, ngroup) as loop:
        base = builder.mul(loop.index, eight)
        for j in range(8):  # unrolled: 8 independent add chains
            t = term(builder.add(base, ir.Constant(base.type, j)))
            builder.store(builder.fadd(builder.load(accs[j]), t), accs[j])
    base = builder.mul(ngroup, eight)
    rem = builder.sub(nblk, base)
    for j in range(7):
        with builder.if_then(builder.icmp_unsigned(">", rem, ir.Constant(rem.type, j))):
            t = term(builder.add(base, ir.Constant(base.type, j)))
            builder.store(builder.fadd(builder.load(accs[j]), t), accs[j])
    return _tree8_vectors(builder, [builder.load(a) for a in accs])


def _splat_f(builder, val, vty):
    undef = ir.Constant(vty, ir.Undefined)
    v = builder.insert_element(undef, val, ir.Constant(_I32, 0))
    return builder.shuffle_vector(v, undef, ir.Constant(ir.VectorType(_I32, vty.count), [0] * vty.count))


def _tile_term(builder, s, d, c, xdp, xsp, b):
    """<16 x float> xdt[16b:16b+16] · (d · float(s) + c · xst[16b:16b+16])."""
    v16f = ir.VectorType(ir.FloatType(), 16)
    sf = builder.sitofp(s, v16f)
    off16 = builder.mul(b, ir.Constant(b.type, TOKENS))
    xdv = builder.load(builder.bitcast(builder.gep(xdp, [off16]), v16f.as_pointer()), align=4)
    xsv = builder.load(builder.bitcast(builder.gep(xsp, [off16]), v16f.as_pointer()), align=4)
    return builder.fmul(xdv, builder.fadd(builder.fmul(_splat_f(builder, d, v16f), sf), builder.fmul(_splat_f(builder, c, v16f), xsv)))


def _tile_block_int(builder, words_ptr, xb, mask=None):
    """<16 x i32> block sums of 16 tokens: 8 weight words at i8* words_ptr (broadcast from memory)
    against a 4-interleaved 512-byte tile block at i8* xb."""
    if USE_VNNI:
        return _vnni_block(builder, words_ptr, xb, mask)
    return _generic_block(builder, words_ptr, xb, mask)


def _f16_at(builder, blk, off):
    p = builder.bitcast(builder.gep(blk, [ir.Constant(_I32, off)]), ir.HalfType().as_pointer())
    return builder.fpext(builder.load(p, align=1), ir.FloatType())


def _block_scale_bias(builder, blk, layout):
    """(d, c) floats of one raw block: c = fp16 min, or d · (fixed offset) for symmetric types."""
    _, _, _, moff, _, cfix, _ = layout
    d = _f16_at(builder, blk, 0)
    c = _f16_at(builder, blk, moff) if moff >= 0 else builder.fmul(d, ir.Constant(ir.FloatType(), cfix))
    return d, c


@intrinsic
def _row_tile_dot_raw8(typingctx, row, kind, xi, xdt, xst, out):
    """_row_tile_dot_raw with the canonical 8-lane float order."""
    f32a = lambda a: isinstance(a, types.Array) and a.dtype == types.float32 and a.ndim == 1  # noqa: E731
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.IntegerLiteral) and kind.literal_value in LAYOUTS
        and isinstance(xi, types.Array) and xi.dtype == types.int8 and xi.ndim == 1
        and f32a(xdt) and f32a(xst) and f32a(out)
    )
    if not ok:
        return None
    layout = LAYOUTS[kind.literal_value]
    sig = types.void(row, kind, xi, xdt, xst, out)

    def codegen(context, builder, signature, args):
        ra, _, xa, xda, xsa, oa = args
        at = signature.args
        v8i32 = ir.VectorType(_I32, 8)
        size = layout[0]
        nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 0)
        nblk = builder.udiv(nblk, ir.Constant(nblk.type, TOKENS))
        rp = _byte_ptr(context, builder, at[0], ra, ir.Constant(ir.IntType(64), 0))
        xp = _byte_ptr(context, builder, at[2], xa, ir.Constant(ir.IntType(64), 0))
        xdp, xsp = _f32_ptr(context, builder, at[3], xda), _f32_ptr(context, builder, at[4], xsa)
        wbuf = cgutils.alloca_once(builder, v8i32)  # decoded block: weights broadcast from memory

        def term(b):
            blk = builder.gep(rp, [builder.mul(b, ir.Constant(b.type, size))])
            builder.store(builder.bitcast(_block_u8(builder, blk, layout), v8i32), wbuf)
            xb = builder.gep(xp, [builder.mul(b, ir.Constant(b.type, 512))])
            s = _tile_block_int(builder, builder.bitcast(wbuf, _I8.as_pointer()), xb)
            d, c = _block_scale_bias(builder, blk, layout)
            return _tile_term(builder, s, d, c, xdp, xsp, b)

        tot = _tile_sum8(builder, nblk, term)
        builder.store(tot, builder.bitcast(_f32_ptr(context, builder, at[5], oa), tot.type.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def row_tile_dot_raw8(row, kind, xi, xdt, xst, out):
    """row_tile_dot_raw (same arguments) in the canonical 8-lane float order shared with rows_dot8."""
    _row_tile_dot_raw8(row, kind, xi, xdt, xst, out)


def _transpose8x8(builder, rows):
    """8 <8 x i32> rows R_j -> 8 columns W_g with W_g[j] = R_j[g] (three unpack/permute stages)."""
    def sh(a, b, ix):
        return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 8), ix))

    lo32, hi32 = [0, 8, 1, 9, 4, 12, 5, 13], [2, 10, 3, 11, 6, 14, 7, 15]
    lo64, hi64 = [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15]
    lo128, hi128 = [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15]
    a = []
    for p in range(4):
        a += [sh(rows[2 * p], rows[2 * p + 1], lo32), sh(rows[2 * p], rows[2 * p + 1], hi32)]
    # a[2p] = R_{2p},R_{2p+1} groups {0,1 | 4,5}; a[2p+1] groups {2,3 | 6,7}
    bq = []
    for h in (0, 4):
        bq += [sh(a[h], a[h + 2], lo64), sh(a[h], a[h + 2], hi64), sh(a[h + 1], a[h + 3], lo64), sh(a[h + 1], a[h + 3], hi64)]
    # bq[q] (q<4): R_0..3 group q | group q+4; bq[4+q]: R_4..7 likewise
    w = [None] * 8
    for q in range(4):
        w[q] = sh(bq[q], bq[4 + q], lo128)
        w[q + 4] = sh(bq[q], bq[4 + q], hi128)
    return w


def _dot_acc(builder, acc, w, x):
    """acc + 4-byte group dots of w (unsigned bytes) · x (signed bytes), all <8 x i32> (one
    token) or <16 x i32> (a token pair: VNNI hosts only, where the pair path is compiled)."""
    vt = ir.VectorType(_I32, acc.type.count)
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt] * 3), f"llvm.x86.avx512.vpdpbusd.{32 * vt.count}")
        return builder.call(fn, [acc, w, x])
    assert vt.count == 8, "the portable dot has 8 lanes"
    v32i8 = ir.VectorType(_I8, 32)
    return builder.add(acc, _dot32(builder, builder.bitcast(w, v32i8), builder.bitcast(x, v32i8)))


@intrinsic
def _rows_dot8(typingctx, row, kind, xt, xq, xd, xs, acc, y, r):
    """y[t, r] = Σ_j w_j·x_tj for every token t, canonical 8-lane float order (see rows_dot8)."""
    ok = (
        isinstance(row, types.Array) and row.dtype == types.uint8 and row.ndim == 1
        and isinstance(kind, types.IntegerLiteral) and kind.literal_value in LAYOUTS
        and isinstance(xt, types.Array) and xt.dtype == types.int8 and xt.ndim == 2
        and isinstance(xq, types.Array) and xq.dtype == types.int8 and xq.ndim == 2
        and isinstance(xd, types.Array) and xd.dtype == types.float32 and xd.ndim == 2
        and isinstance(xs, types.Array) and xs.dtype == types.int32 and xs.ndim == 2
        and isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1
        and isinstance(y, types.Array) and y.dtype == types.float32 and y.ndim == 2
        and isinstance(r, types.Integer)
    )
    if not ok:
        return None
    layout = LAYOUTS[kind.literal_value]
    sig = types.void(row, kind, xt, xq, xd, xs, acc, y, r)

    def codegen(context, builder, signature, args):
        ra, _, xta, xa, xda, xsa, acca, ya, ri = args
        at = signature.args
        f32 = ir.FloatType()
        i64 = ir.IntType(64)
        v8f = ir.VectorType(f32, 8)
        v8i32 = ir.VectorType(_I32, 8)
        v8h = ir.VectorType(ir.HalfType(), 8)
        size, _, _, moff, _, cfix, _ = layout
        xtarr = context.make_array(at[2])(context, builder, xta)
        xts = builder.extract_value(xtarr.shape, 1)
        xarr = context.make_array(at[3])(context, builder, xa)
        n = builder.extract_value(xarr.shape, 0)
        nblk = builder.extract_value(context.make_array(at[4])(context, builder, xda).shape, 1)
        yarr = context.make_array(at[7])(context, builder, ya)
        m = builder.extract_value(yarr.shape, 1)
        rp = _byte_ptr(context, builder, at[0], ra, ir.Constant(i64, 0))
        rowbytes = builder.extract_value(context.make_array(at[0])(context, builder, ra).shape, 0)
        # an all-true mask LLVM cannot prove all-true (the length's sign bit is 0): keeps masked loads unmerged
        sign = builder.trunc(builder.lshr(rowbytes, ir.Constant(i64, 63)), ir.IntType(16))
        all_live = builder.icmp_unsigned("==", _splat(builder, sign, ir.VectorType(ir.IntType(16), 32)), ir.Constant(ir.VectorType(ir.IntType(16), 32), None))
        xtp = builder.bitcast(xtarr.data, _I8.as_pointer())
        xdp = _f32_ptr(context, builder, at[4], xda)
        xsp = builder.bitcast(context.make_array(at[5])(context, builder, xsa).data, _I32.as_pointer())
        accp = _f32_ptr(context, builder, at[6], acca)  # [n, 8] lane accumulators
        yp = builder.bitcast(yarr.data, f32.as_pointer())
        r64 = context.cast(builder, ri, at[8], types.intp)
        eight = ir.Constant(i64, 8)
        zero8f = ir.Constant(v8f, None)
        zero8i = zero8i_ = ir.Constant(v8i32, None)
        i1 = ir.IntType(1)
        v8i1 = ir.VectorType(i1, 8)
        mload_f = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8f, [v8f.as_pointer(), _I32, v8i1, v8f]), "llvm.masked.load.v8f32.p0v8f32")
        v32w_ = ir.VectorType(ir.IntType(16), 32)
        mload_w = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v32w_, [v32w_.as_pointer(), _I32, ir.VectorType(ir.IntType(1), 32), v32w_]), "llvm.masked.load.v32i16.p0v32i16")
        mload_i = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v8i32, [v8i32.as_pointer(), _I32, v8i1, v8i32]), "llvm.masked.load.v8i32.p0v8i32")

        def half_at(blk, off):
            return builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I32, off)]), ir.HalfType().as_pointer()), align=1)

        def group(grp, nvalid, first):
            """Lanes += the 8 block terms of group grp for every token. nvalid: None for a full
            group, else the number of real blocks (the rest are zero terms: x is zero-padded, d, c,
            xd, xs are masked to zero, and their weight reads are clamped into the row). A Python
            int nvalid is known at compile time: blocks past it are not read at all."""
            b0 = builder.mul(grp, eight)
            known = isinstance(nvalid, int)
            if nvalid is None:
                bidx = [builder.add(b0, ir.Constant(i64, j)) for j in range(8)]
            elif known:
                bidx = [builder.add(b0, ir.Constant(i64, j)) if j < nvalid else None for j in range(8)]
                lane_ok = ir.Constant(v8i1, [j < nvalid for j in range(8)])
            else:
                valid = [builder.icmp_unsigned(">", nvalid, ir.Constant(i64, j)) for j in range(8)]
                bidx = [builder.select(valid[j], builder.add(b0, ir.Constant(i64, j)), b0) for j in range(8)]
                lane_ok = ir.Constant(v8i1, ir.Undefined)
                for j in range(8):
                    lane_ok = builder.insert_element(lane_ok, valid[j], ir.Constant(_I32, j))
            blks = [builder.gep(rp, [builder.mul(bj, ir.Constant(i64, size))]) if bj is not None else None for bj in bidx]
            # 8 blocks decoded once for every token, transposed so that vector g holds group g
            # of each block: one vpdpbusd per group then sums whole blocks into lanes
            w = _transpose8x8(builder, [builder.bitcast(_block_u8(builder, blk, layout), v8i32) if blk is not None else zero8i_ for blk in blks])
            if nvalid is None and USE_VNNI:
                # the 8 blocks' bytes as 512-bit vectors of 16-bit words, fp16 fields picked by
                # two-source shuffles (vpermt2w) instead of 8 inserts each. Masked loads (the last
                # one to the group's 4·size words): plain ones get merged by LLVM with the quant
                # loads, which it then extracts from these vectors word by word.
                v32w = ir.VectorType(ir.IntType(16), 32)
                nwords = 4 * size
                i16 = ir.IntType(16)
                nvec = (nwords + 31) // 32
                left = builder.sub(rowbytes, builder.mul(b0, ir.Constant(i64, size)))  # bytes to the row's end
                left = builder.select(builder.icmp_unsigned("<", left, ir.Constant(i64, 2 * nwords)), left, ir.Constant(i64, 2 * nwords))
                lim = builder.trunc(builder.sub(builder.udiv(left, ir.Constant(i64, 2)), ir.Constant(i64, 32 * (nvec - 1))), i16)
                lanes32 = ir.Constant(v32w, list(range(32)))
                wvecs = []
                for i in range(nvec):
                    ptr = builder.bitcast(builder.gep(blks[0], [ir.Constant(_I32, 64 * i)]), v32w.as_pointer())
                    live = all_live if i < nvec - 1 else builder.icmp_signed("<", lanes32, _splat(builder, lim, v32w))
                    wvecs.append(builder.call(mload_w, [ptr, ir.Constant(_I32, 1), live, ir.Constant(v32w, None)]))
                if len(wvecs) % 2:
                    wvecs.append(ir.Constant(v32w, None))

                def halves(off):
                    pos = [(size * j + off) // 2 for j in range(8)]
                    out = None
                    for q in range(len(wvecs) // 2):  # words 64q .. 64q+63
                        mine = [p - 64 * q if 64 * q <= p < 64 * (q + 1) else 0 for p in pos]
                        part = builder.shuffle_vector(wvecs[2 * q], wvecs[2 * q + 1], ir.Constant(ir.VectorType(_I32, 8), mine))
                        if out is None:
                            out = part
                        elif any(64 * q <= p < 64 * (q + 1) for p in pos):
                            take = [8 + j if 64 * q <= pos[j] < 64 * (q + 1) else j for j in range(8)]
                            out = builder.shuffle_vector(out, part, ir.Constant(ir.VectorType(_I32, 8), take))
                    return builder.bitcast(out, v8h)
            else:  # clamped block pointers: one fp16 load each

                def halves(off):
                    h = ir.Constant(v8h, None)
                    for j in range(8):
                        if blks[j] is not None:
                            h = builder.insert_element(h, half_at(blks[j], off), ir.Constant(_I32, j))
                    return h
            dv = builder.fpext(halves(0), v8f)
            if moff >= 0:
                cv = builder.fpext(halves(moff), v8f)
            else:
                cv = builder.fmul(dv, ir.Constant(v8f, [cfix] * 8))
            if nvalid is not None:
                dv = builder.select(lane_ok, dv, zero8f)
                cv = builder.select(lane_ok, cv, zero8f)
            def pair_of(a, b):  # two <w x ...> -> <2w x ...>
                return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 2 * a.type.count), list(range(2 * a.type.count))))

            def scales(t):
                """xd, xs (as float) of token t's 8 blocks in this group."""
                tb = builder.add(builder.mul(t, nblk), b0)
                xdq = builder.bitcast(builder.gep(xdp, [tb]), v8f.as_pointer())
                xsq = builder.bitcast(builder.gep(xsp, [tb]), v8i32.as_pointer())
                if nvalid is None:
                    return builder.load(xdq, align=4), builder.load(xsq, align=4)
                # masked: no read past the token's row (or the array)
                return (builder.call(mload_f, [xdq, ir.Constant(_I32, 4), lane_ok, zero8f]),
                        builder.call(mload_i, [xsq, ir.Constant(_I32, 4), lane_ok, zero8i]))

            def accumulate(t, sf, xdv, xsi):
                """Token t's 8 lanes += xd · (d · s + c · xs) (the canonical term)."""
                term = builder.fmul(xdv, builder.fadd(builder.fmul(dv, sf), builder.fmul(cv, builder.sitofp(xsi, sf.type))))
                ap = builder.bitcast(builder.gep(accp, [builder.mul(t, eight)]), sf.type.as_pointer())
                prev = builder.select(first, zero8f, builder.load(ap, align=4))  # lanes start at +0.0
                builder.store(builder.fadd(prev, term), ap, align=4)

            def one_token(t):
                # token t's group g: xt[t // 2, 512·grp + 64·g + 32·(t % 2)]
                half = builder.mul(builder.and_(t, ir.Constant(i64, 1)), ir.Constant(i64, 32))
                xg = builder.gep(xtp, [builder.add(builder.add(builder.mul(builder.lshr(t, ir.Constant(i64, 1)), xts), builder.mul(grp, ir.Constant(i64, 512))), half)])
                s = [zero8i] * 4  # four chains: dependent vpdpbusd are latency-bound
                for g in range(8):
                    xv = builder.load(builder.bitcast(builder.gep(xg, [ir.Constant(_I32, 64 * g)]), v8i32.as_pointer()), align=1)
                    s[g % 4] = _dot_acc(builder, s[g % 4], w[g], xv)
                sf = builder.sitofp(builder.add(builder.add(s[0], s[1]), builder.add(s[2], s[3])), v8f)
                xdv, xsi = scales(t)
                accumulate(t, sf, xdv, xsi)

            def two_tokens(t):
                # tokens t, t+1 (t even) in one 512-bit vector each step: repack_groups8 stores the
                # pair's group g side by side, and every lane computes what one_token's would
                v16i32, v16f = ir.VectorType(_I32, 16), ir.VectorType(f32, 16)
                dup = ir.Constant(ir.VectorType(_I32, 16), list(range(8)) * 2)
                xg = builder.gep(xtp, [builder.add(builder.mul(builder.lshr(t, ir.Constant(i64, 1)), xts), builder.mul(grp, ir.Constant(i64, 512)))])
                s = [ir.Constant(v16i32, None)] * 4
                for g in range(8):
                    xv = builder.load(builder.bitcast(builder.gep(xg, [ir.Constant(_I32, 64 * g)]), v16i32.as_pointer()), align=1)
                    s[g % 4] = _dot_acc(builder, s[g % 4], builder.shuffle_vector(w[g], w[g], dup), xv)
                sf = builder.sitofp(builder.add(builder.add(s[0], s[1]), builder.add(s[2], s[3])), v16f)
                (xd0, xs0), (xd1, xs1) = scales(t), scales(builder.add(t, ir.Constant(i64, 1)))
                xdv, xsi = pair_of(xd0, xd1), pair_of(xs0, xs1)
                dv2, cv2 = builder.shuffle_vector(dv, dv, dup), builder.shuffle_vector(cv, cv, dup)
                term = builder.fmul(xdv, builder.fadd(builder.fmul(dv2, sf), builder.fmul(cv2, builder.sitofp(xsi, v16f))))
                ap = builder.bitcast(builder.gep(accp, [builder.mul(t, eight)]), v16f.as_pointer())
                prev = builder.select(first, ir.Constant(v16f, None), builder.load(ap, align=4))  # lanes start at +0.0
                builder.store(builder.fadd(prev, term), ap, align=4)

            if nvalid is None:
                if USE_VNNI:
                    with cgutils.for_range(builder, builder.lshr(n, ir.Constant(i64, 1))) as pl:
                        two_tokens(builder.shl(pl.index, ir.Constant(i64, 1)))
                    with builder.if_then(builder.icmp_unsigned("!=", builder.and_(n, ir.Constant(i64, 1)), ir.Constant(i64, 0))):
                        one_token(builder.sub(n, ir.Constant(i64, 1)))
                else:
                    with cgutils.for_range(builder, n) as tl:
                        one_token(tl.index)
                return
            # a last group of <= 4 blocks: repack_groups8 packs token pairs into its lanes 0-3 and
            # 4-7, so one vpdpbusd serves two tokens. Lanes 4-7 of each token hold only zero terms,
            # and adding a zero to a lane (never -0.0: lanes start at +0.0) changes nothing, so
            # skipping them keeps the canonical order's result bit for bit.
            if known:
                packs = ir.Constant(i1, nvalid <= 4)
            else:
                packs = builder.icmp_unsigned("<=", nvalid, ir.Constant(i64, 4))
            with builder.if_else(packs) as (packed, spread):
                with packed:
                    v4f = ir.VectorType(f32, 4)
                    v4i = ir.VectorType(_I32, 4)
                    v4i1 = ir.VectorType(i1, 4)
                    mload_f4 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v4f, [v4f.as_pointer(), _I32, v4i1, v4f]), "llvm.masked.load.v4f32.p0v4f32")
                    mload_i4 = cgutils.get_or_insert_function(builder.module, ir.FunctionType(v4i, [v4i.as_pointer(), _I32, v4i1, v4i]), "llvm.masked.load.v4i32.p0v4i32")
                    lo4, twice = ir.Constant(ir.VectorType(_I32, 4), [0, 1, 2, 3]), ir.Constant(ir.VectorType(_I32, 8), [0, 1, 2, 3, 0, 1, 2, 3])
                    ok4 = builder.shuffle_vector(lane_ok, ir.Constant(v8i1, ir.Undefined), lo4)
                    w2 = [builder.shuffle_vector(wg, ir.Constant(v8i32, ir.Undefined), twice) for wg in w]
                    dv2 = builder.shuffle_vector(dv, ir.Constant(v8f, ir.Undefined), twice)
                    cv2 = builder.shuffle_vector(cv, ir.Constant(v8f, ir.Undefined), twice)
                    zero4f = ir.Constant(v4f, None)
                    with cgutils.for_range(builder, builder.lshr(n, ir.Constant(i64, 1))) as pl:
                        xg = builder.gep(xtp, [builder.add(builder.mul(pl.index, xts), builder.mul(grp, ir.Constant(i64, 512)))])
                        sacc = [zero8i] * 4
                        for g in range(8):
                            xv = builder.load(builder.bitcast(builder.gep(xg, [ir.Constant(_I32, 64 * g)]), v8i32.as_pointer()), align=1)
                            sacc[g % 4] = _dot_acc(builder, sacc[g % 4], w2[g], xv)
                        sf = builder.sitofp(builder.add(builder.add(sacc[0], sacc[1]), builder.add(sacc[2], sacc[3])), v8f)
                        t0 = builder.shl(pl.index, ir.Constant(i64, 1))
                        toks = (t0, builder.add(t0, ir.Constant(i64, 1)))
                        xd4, xs4 = [], []
                        for t in toks:
                            tb = builder.add(builder.mul(t, nblk), b0)
                            xd4.append(builder.call(mload_f4, [builder.bitcast(builder.gep(xdp, [tb]), v4f.as_pointer()), ir.Constant(_I32, 4), ok4, zero4f]))
                            xs4.append(builder.call(mload_i4, [builder.bitcast(builder.gep(xsp, [tb]), v4i.as_pointer()), ir.Constant(_I32, 4), ok4, ir.Constant(v4i, None)]))
                        xdv, xsi = pair_of(xd4[0], xd4[1]), pair_of(xs4[0], xs4[1])
                        term = builder.fmul(xdv, builder.fadd(builder.fmul(dv2, sf), builder.fmul(cv2, builder.sitofp(xsi, v8f))))
                        for h, t in enumerate(toks):
                            termh = builder.shuffle_vector(term, ir.Constant(v8f, ir.Undefined), ir.Constant(ir.VectorType(_I32, 4), [4 * h + i for i in range(4)]))
                            ap = builder.gep(accp, [builder.mul(t, eight)])
                            ap4 = builder.bitcast(ap, v4f.as_pointer())
                            prev = builder.select(first, zero4f, builder.load(ap4, align=4))  # lanes start at +0.0
                            builder.store(builder.fadd(prev, termh), ap4, align=4)
                            with builder.if_then(first):  # lanes 4-7 are otherwise never written
                                builder.store(zero4f, builder.bitcast(builder.gep(ap, [ir.Constant(_I32, 4)]), v4f.as_pointer()), align=4)
                    with builder.if_then(builder.icmp_unsigned("!=", builder.and_(n, ir.Constant(i64, 1)), ir.Constant(i64, 0))):
                        one_token(builder.sub(n, ir.Constant(i64, 1)))  # alone in its pair: partner lanes are zero
                with spread:
                    with cgutils.for_range(builder, n) as tl:
                        one_token(tl.index)

        nfull = builder.udiv(nblk, eight)
        with cgutils.for_range(builder, nfull) as gl:
            group(gl.index, None, builder.icmp_unsigned("==", gl.index, ir.Constant(i64, 0)))
        rem = builder.sub(nblk, builder.mul(nfull, eight))
        with builder.if_then(builder.icmp_unsigned("!=", rem, ir.Constant(i64, 0))):
            # 4 left (k = 640, 896, 1152: 2.5, 3.5, 4.5 groups) compiles its own code that reads 4 blocks, not 8
            with builder.if_else(builder.icmp_unsigned("==", rem, ir.Constant(i64, 4))) as (four, other):
                with four:
                    group(nfull, 4, builder.icmp_unsigned("==", nfull, ir.Constant(i64, 0)))
                with other:
                    group(nfull, rem, builder.icmp_unsigned("==", nfull, ir.Constant(i64, 0)))

        with cgutils.for_range(builder, n) as tl:
            t = tl.index
            lanes = builder.load(builder.bitcast(builder.gep(accp, [builder.mul(t, eight)]), v8f.as_pointer()), align=4)
            builder.store(_tree8_lanes(builder, lanes), builder.gep(yp, [builder.add(builder.mul(t, m), r64)]))
        return context.get_dummy_value()

    return sig, codegen


@nb.njit(cache=True, nogil=True, inline="always")
def rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r):
    """Column r of y [n, m] for one raw weight row of LAYOUTS[kind] blocks (kind a compile-time
    constant) and all n tokens, in the canonical 8-lane float order (bit-identical to
    row_tile_dot_raw8's lane for the same token). Each group of 8 blocks is decoded once for all
    tokens and transposed, so one vpdpbusd per 4-byte group sums 8 whole blocks into 8 lanes.

    xt int8 [ceil(n/2), ceil(k/256)·512]: xq repacked by repack_groups8; xq int8 [n, k] (its shape only);
    xd float32 [n, k/32]; xs int32 [n, k/32]; acc float32 scratch [>= 8n]. Sizes are not checked:
    the caller guarantees them."""
    _rows_dot8(row, kind, xt, xq, xd, xs, acc, y, r)


@nb.njit(cache=True, nogil=True)
def repack_groups8(xq, xt):
    """Activations in rows_dot8's order: for each group G of 8 blocks, 4-byte group g of the 8
    blocks side by side (the transposed weights' lanes), tokens in pairs:
        xt[t // 2, 512G + 64g + 32(t % 2) + 4j + q] = xq[t, 32(8G + j) + 4g + q],
    except a last group of at most 4 blocks, which packs the pair into one 32-byte vector:
        xt[t // 2, 512G + 64g + 16(t % 2) + 4j + q] (j < 4).
    Everything else (blocks past the row's end, an odd last token's partner) is zero.
    xt int8 [ceil(n/2), ceil(k/256) · 512]."""
    n, k = xq.shape
    nblk = k // 32
    ngroup = xt.shape[1] // 512
    xq4 = xq.view(np.int32)  # [n, k/4]: whole 4-byte groups move
    xt4 = xt.view(np.int32)  # [ceil(n/2), ngroup · 128]
    xt[:] = 0
    for t in range(n):
        p = t // 2
        for grp in range(ngroup):
            nb_here = min(8, nblk - grp * 8)
            h = (t % 2) * (4 if nb_here <= 4 else 8)
            for j in range(nb_here):
                b = grp * 8 + j
                for g in range(8):
                    xt4[p, grp * 128 + g * 16 + h + j] = xq4[t, b * 8 + g]
