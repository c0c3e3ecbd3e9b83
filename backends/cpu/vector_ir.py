"""LLVM IR building blocks shared by the integer matmul kernels (legacy_*.py, kquant_*.py).

The host feature flags that pick each codegen path, vector types, loads and stores at byte
offsets, splats and shuffles, the u8 × i8 → int32 dot (vpdpbusd on AVX-512 VNNI hosts, portable
vector IR elsewhere), fp16 widening, the IQ4 codebook lookup and a run-time switch over
intrinsic bodies. Nothing here is a kernel: these helpers emit IR into a caller's codegen.
"""

import llvmlite.binding as llvm
from llvmlite import ir
from numba.core import cgutils, types

# Read at codegen time (as vector_ir.USE_VNNI, never copied into another module): tests set them
# to False, and compile uncached, to run the portable paths on a VNNI host.
USE_VNNI = bool(llvm.get_host_cpu_features().get("avx512vnni", False))
USE_F16C = bool(llvm.get_host_cpu_features().get("f16c", False))

I1, I8, I16, I32, I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
F32 = ir.FloatType()


def vec(t, n):
    return ir.VectorType(t, n)


V64I8, V32I8, V16I8 = vec(I8, 64), vec(I8, 32), vec(I8, 16)
V32I16 = vec(I16, 32)
V16I32, V8I32, V4I32 = vec(I32, 16), vec(I32, 8), vec(I32, 4)
V16F, V8F = vec(F32, 16), vec(F32, 8)

# IQ4_NL / IQ4_XS levels (llama.cpp's kvalues_iq4nl) + 128: the unsigned bytes the u8 × i8 dot takes
IQ4_LEVELS_U8 = tuple(v + 128 for v in (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113))


# ------------------------------------------------------------------------------- arguments


def is_arr(t, dtype):
    return isinstance(t, types.Array) and t.dtype == dtype and t.layout == "C"


def ints(*ts):
    return all(isinstance(t, types.Integer) for t in ts)


def as_i64(context, builder, val, ty):
    return context.cast(builder, val, ty, types.int64)


def base_ptr(context, builder, arrty, arr, off):
    """i8* to element `off` (an LLVM integer) of a C-contiguous array of any rank."""
    ary = context.make_array(arrty)(context, builder, arr)
    p = builder.gep(ary.data, [off])
    return builder.bitcast(p, I8.as_pointer())


def f32_ptr(context, builder, arrty, arr):
    ary = context.make_array(arrty)(context, builder, arr)
    return builder.bitcast(ary.data, F32.as_pointer())


# ------------------------------------------------------------------------------- loads, vectors


def load(builder, p, boff, ty, align=1):
    """Load a value of type `ty` from i8* p + boff bytes (boff a Python int or an LLVM i64)."""
    if isinstance(boff, int):
        boff = ir.Constant(I64, boff)
    q = builder.bitcast(builder.gep(p, [boff]), ty.as_pointer())
    return builder.load(q, align=align)


def store(builder, val, p, boff, align=1):
    if isinstance(boff, int):
        boff = ir.Constant(I64, boff)
    builder.store(val, builder.bitcast(builder.gep(p, [boff]), val.type.as_pointer()), align=align)


def prefetch_lines(builder, p, boff, nbytes):
    """Software-prefetch (prefetcht0) the cache lines of bytes boff .. boff + nbytes of i8* p, boff an
    LLVM i64: a hint that never faults, so it may point past an array's end (the next rows)."""
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(ir.VoidType(), [I8.as_pointer(), I32, I32, I32]), "llvm.prefetch.p0i8")
    for line in range(0, nbytes, 64):
        q = builder.gep(p, [builder.add(boff, ir.Constant(I64, line))])
        builder.call(fn, [q, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def splat(builder, x, vty):
    """Vector of type vty with every lane = scalar x."""
    one = builder.insert_element(ir.Constant(vty, ir.Undefined), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(one, ir.Constant(vty, ir.Undefined), ir.Constant(vec(I32, vty.count), [0] * vty.count))


def const(vty, vals):
    return ir.Constant(vty, list(vals) if not isinstance(vals, int) else [vals] * vty.count)


def shuf(builder, a, idx, b=None):
    idx = list(idx)
    return builder.shuffle_vector(a, b if b is not None else ir.Constant(a.type, ir.Undefined), ir.Constant(vec(I32, len(idx)), idx))


def loop(builder, count, body, init):
    """for i in range(count) with loop-carried LLVM values (a list), returning their final values.
    Carried values live in allocas (promoted to registers by LLVM's mem2reg)."""
    slots = [cgutils.alloca_once_value(builder, v) for v in init]
    with cgutils.for_range(builder, count) as lp:
        vals = [builder.load(s) for s in slots]
        new = body(lp.index, vals)
        for s, v in zip(slots, new):
            builder.store(v, s)
    return [builder.load(s) for s in slots]


def emit_switch(builder, key, cases):
    """Emit the IR of cases[v]() (a dict of int, or tuple of ints sharing one body, -> a function
    emitting code at the builder's position) where the run-time integer `key` equals v; any other
    key runs none of them. So one compiled kernel serves every type, each type's body apart."""
    end = builder.append_basic_block("switch.end")
    sw = builder.switch(key, end)
    for vals, emit in cases.items():
        bb = builder.append_basic_block("switch.case")
        for v in vals if isinstance(vals, tuple) else (vals,):
            sw.add_case(ir.Constant(key.type, v), bb)
        with builder.goto_block(bb):
            emit()
            builder.branch(end)
    builder.position_at_end(end)


# ------------------------------------------------------------------------------- integer dot, decoding


def dpbusd(builder, acc, w, x):
    """acc (16 or 8 x i32) + per-lane Σ of 4 products unsigned w bytes × signed x bytes (64 or 32
    x i8 each, or i32 vectors of the same size): vpdpbusd on VNNI hosts, else zext × sext and
    sums of 4 lanes."""
    lanes = acc.type.count
    vt = vec(I32, lanes)
    if USE_VNNI:
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vt, [vt] * 3), f"llvm.x86.avx512.vpdpbusd.{32 * lanes}")
        return builder.call(fn, [acc, builder.bitcast(w, vt), builder.bitcast(x, vt)])
    bt = vec(I8, 4 * lanes)
    prod = builder.mul(builder.zext(builder.bitcast(w, bt), vec(I32, 4 * lanes)),
                       builder.sext(builder.bitcast(x, bt), vec(I32, 4 * lanes)))
    for q in range(4):
        acc = builder.add(acc, shuf(builder, prod, [4 * t + q for t in range(lanes)]))
    return acc


def iq4_lookup(builder, idx, levels=IQ4_LEVELS_U8):
    """levels[idx] (16 unsigned bytes; default the IQ4 codebook + 128, MXFP4 passes its own) for a
    16, 32 or 64 x i8 vector of indices 0..15: vpshufb on AVX-512 hosts (the VNNI ones), a chain of 16
    selects elsewhere."""
    vt = idx.type
    if USE_VNNI:
        name = {16: "llvm.x86.ssse3.pshuf.b.128", 32: "llvm.x86.avx2.pshuf.b"}.get(vt.count, "llvm.x86.avx512.pshuf.b.512")
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]), name)
        return builder.call(fn, [const(vt, list(levels) * (vt.count // 16)), idx])
    out = const(vt, levels[0])
    for i in range(1, 16):
        out = builder.select(builder.icmp_unsigned("==", idx, const(vt, i)), const(vt, levels[i]), out)
    return out


def f16_to_f32(builder, h):
    """Exact float32 of the IEEE half bit pattern h (i16). With F16C an fpext (vcvtph2ps);
    otherwise integer ops (an fpext there may become a libcall Numba does not link): the bits
    shifted into float32 position and scaled by 2^112 (exact for normals and subnormals), with
    exponent 31 (inf / NaN) patched separately, as quant/f16.py does."""
    if USE_F16C:
        return builder.fpext(builder.bitcast(h, ir.HalfType()), F32)
    h = builder.zext(h, I32)
    sign = builder.shl(builder.and_(h, ir.Constant(I32, 0x8000)), ir.Constant(I32, 16))
    em = builder.shl(builder.and_(h, ir.Constant(I32, 0x7FFF)), ir.Constant(I32, 13))
    scaled = builder.fmul(builder.bitcast(em, F32), ir.Constant(F32, 2.0**112))
    special = builder.icmp_unsigned("==", builder.and_(h, ir.Constant(I32, 0x7C00)), ir.Constant(I32, 0x7C00))
    infnan = builder.or_(em, ir.Constant(I32, 0x7F800000))
    bits = builder.select(special, infnan, builder.bitcast(scaled, I32))
    return builder.bitcast(builder.or_(bits, sign), F32)
