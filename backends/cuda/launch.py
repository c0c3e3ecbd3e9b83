"""Launch configurations and the cross-thread reductions every kernel shares.

Reductions have two implementations picked at import: warp shuffles on a real device, and a
shared-memory version under the CUDA simulator (NUMBA_ENABLE_CUDASIM=1), which has no shuffles.
Both take the same arguments, so kernels are written once: each kernel allocates a shared
`scratch` array of one entry per thread (unused on a real device) and every thread of the block
must make the call (no early returns before a reduction).
"""

from numba import cuda

# True under the CUDA simulator: asked of numba.cuda itself (the env var may have changed since)
SIM = "simulator" in getattr(cuda.to_device, "__module__", "")
FULL_MASK = 0xFFFFFFFF
WARP = 32


def blocks_for(n: int, threads: int) -> int:
    """Blocks of `threads` threads covering n work items (at least one block)."""
    return max(1, (int(n) + threads - 1) // threads)


def threads_1d(n: int, cap: int = 256) -> int:
    """Threads per block for an elementwise kernel over n items: a multiple of 32, at most `cap`
    (small n keeps the block small, which also keeps the simulator fast)."""
    return max(WARP, min(cap, (int(n) + WARP - 1) // WARP * WARP))


def launch_1d(n: int, cap: int = 256):
    """(blocks, threads) for one thread per item over n items."""
    t = threads_1d(n, cap)
    return blocks_for(n, t), t


@cuda.jit(device=True, inline=True)
def _sum_shfl(v, width, scratch, tid):
    """Butterfly sum over the group by warp shuffles (the type of v: int32 or float32)."""
    o = width >> 1
    while o > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, o)
        o >>= 1
    return v


@cuda.jit(device=True)
def _sum_shared(v, width, scratch, tid):
    """The same sum through shared memory (in scratch's type), for the simulator."""
    cuda.syncthreads()  # earlier readers of scratch are done
    scratch[tid] = v
    cuda.syncthreads()
    base = tid - tid % width
    s = scratch[base]
    for i in range(1, width):
        s += scratch[base + i]
    return s


# isum(v, width, scratch, tid): int32 sum of v over aligned groups of `width` lanes (a power of
# two <= 32), returned to every lane of the group; fsum: the same for float32 (scratch of the
# matching type).
isum = fsum = _sum_shared if SIM else _sum_shfl
