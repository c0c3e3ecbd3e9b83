"""IR of the legacy gemv's one-token path over a run of rows (legacy_gemv.rows_dot8_one).

At n = 1 the general row dot (legacy_gemv_ir.GemvRowEmitter) spends about half of a k = 640 row
outside its groups' dots: the lanes go through memory each group, the last group of 4 takes the
token-pair path, and each row is a call of its own (docs/kernels.md, "The one-token gemv over a
run of rows"). This emitter runs a task's rows in one loop with each row's 8 lanes in registers.
Rows are read one after another, in memory order: rows read side by side ran up to 2x slower from
DRAM. Every lane gets the float operations GemvRowEmitter.one_token gives it, in its order, so
the bits are the general path's.
"""

from types import SimpleNamespace

from llvmlite import ir
from numba.core import cgutils, types

from edged.backends.cpu import vector_ir as vir
from edged.backends.cpu.legacy_blocks import int_bias, tree8_lanes
from edged.backends.cpu.legacy_gemv_ir import GemvRowEmitter, _masked_load
from edged.backends.cpu.legacy_groups import TAIL
from edged.backends.cpu.vector_ir import I8, I32

_F32, _I64 = ir.FloatType(), ir.IntType(64)
_V8F, _V8I32 = ir.VectorType(_F32, 8), ir.VectorType(I32, 8)
_V8I1 = ir.VectorType(ir.IntType(1), 8)


def _i64(v):
    return ir.Constant(_I64, v)


class GemvRowsEmitter(GemvRowEmitter):
    """Emits rows_dot8_one's body: y[0, r] for r0 <= r < r1, for grouped rows of one layout whose
    blocks are whole groups of 8 and at most a last group of 4 (the caller checks: one_token_rows)."""

    def __init__(self, context, builder, signature, args, layout):  # noqa: super's init reads other args
        self.b = builder
        self.layout = layout
        self.grouped = True
        self.size, _, _, self.moff, _, self.cfix, _ = layout
        self.bias = int_bias(layout)
        wa, _, xta, xda, xsa, ya, r0, r1, pf = args
        at = signature.args
        self.wp = vir.base_ptr(context, builder, at[0], wa, _i64(0))
        self.rowbytes = builder.extract_value(context.make_array(at[0])(context, builder, wa).shape, 1)
        self.r0 = context.cast(builder, r0, at[6], types.int64)
        self.r1 = context.cast(builder, r1, at[7], types.int64)
        self.pf = context.cast(builder, pf, at[8], types.int64)
        self.xtp = builder.bitcast(context.make_array(at[2])(context, builder, xta).data, I8.as_pointer())
        self.nblk = builder.extract_value(context.make_array(at[3])(context, builder, xda).shape, 1)
        self.xdp = vir.f32_ptr(context, builder, at[3], xda)
        self.xsp = builder.bitcast(context.make_array(at[4])(context, builder, xsa).data, I32.as_pointer())
        self.yp = builder.bitcast(context.make_array(at[5])(context, builder, ya).data, _F32.as_pointer())
        self.mload_f = _masked_load(builder, _V8F, "llvm.masked.load.v8f32.p0v8f32")
        self.mload_i = _masked_load(builder, _V8I32, "llvm.masked.load.v8i32.p0v8i32")

    def emit(self):
        b = self.b
        nfull = b.udiv(self.nblk, _i64(8))
        tail = b.icmp_unsigned("!=", b.sub(self.nblk, b.mul(nfull, _i64(8))), _i64(0))  # a last group of 4
        lanes = cgutils.alloca_once(b, _V8F)
        with cgutils.for_range(b, b.sub(self.r1, self.r0)) as rl:
            r = b.add(self.r0, rl.index)
            self.rp = b.gep(self.wp, [b.mul(r, self.rowbytes)])
            zero = ir.Constant(_V8F, None)  # lanes start at +0.0, as one_token's first group adds to
            b.store(vir.loop(b, nfull, lambda grp, acc: [self.group_row(grp, None, acc[0])], [zero])[0], lanes)
            with b.if_then(tail):
                b.store(self.group_row(nfull, TAIL, b.load(lanes)), lanes)
            b.store(tree8_lanes(b, b.load(lanes)), b.gep(self.yp, [r]))

    def group_row(self, grp, nvalid, acc):
        """acc <8 x float> + the row's 8 block terms of group grp (nvalid: None for a whole group,
        TAIL for the last group of 4): one_token's terms for token 0."""
        b = self.b
        g = SimpleNamespace(grp=grp, nvalid=nvalid, first=None, b0=b.mul(grp, _i64(8)))
        if nvalid is not None:
            g.lane_ok = ir.Constant(_V8I1, [j < nvalid for j in range(8)])
        with b.if_then(b.icmp_signed(">", self.pf, _i64(0))):  # as rows_dot8: pf bytes past the group
            vir.prefetch_lines(b, self.rp, b.add(b.mul(g.b0, _i64(self.size)), self.pf), 8 * self.size)
        self.group_weights(g)
        self.group_scales(g)
        xg = b.gep(self.xtp, [b.mul(grp, _i64(512))])  # token 0's group j: xt[0, 512·grp + 64·j]
        s = [ir.Constant(_V8I32, None)] * 4
        for j in range(8):
            xv = b.load(b.bitcast(b.gep(xg, [ir.Constant(I32, 64 * j)]), _V8I32.as_pointer()), align=1)
            s[j % 4] = vir.dpbusd(b, s[j % 4], g.w[j], xv)
        s = b.add(b.add(s[0], s[1]), b.add(s[2], s[3]))
        xdv, xsi = self.scales(g, _i64(0))
        return b.fadd(acc, self._term(s, xdv, xsi, g.dv, g.cv))
