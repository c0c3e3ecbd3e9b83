"""Decode attention time per layer for Gemma 3 270M's shapes (4 q heads, 1 kv head, head_dim 256).

Prints, for contexts 512/2k/8k and 1 or 16 sequences, the median time of one attention call
(every sequence decoding one token over its whole context) and the K/V bytes it streams, as wall
time and as process CPU time (which a busy shared machine inflates less; with NUMBA_NUM_THREADS=1
it is the kernel's own cost, while with more threads it also counts spin-waiting).
Usage: .venv/bin/python bench/attention.py [--repeat 20] [--block-size 16] [--window 0] [--kv-type f16]
"""

import argparse
import time

import numpy as np

from edged.backends.base import Batch
from edged.backends.base import KV_DEFAULT, KV_TYPES, kv_row_bytes
from edged.backends.cpu import allocate_kv, attention, store_kv

N_HEADS, N_KV, HEAD_DIM = 4, 1, 256


def decode_batch(n_seqs: int, ctx: int, bs: int, rng) -> tuple[Batch, int]:
    """n_seqs decodes at position ctx - 1, each owning ctx/bs shuffled blocks."""
    per_seq = -(-ctx // bs)
    ids = rng.permutation(n_seqs * per_seq).astype(np.int32)
    tables = ids.reshape(n_seqs, per_seq)
    pos = np.full(n_seqs, ctx - 1, dtype=np.int32)
    batch = Batch(
        token_ids=np.zeros(n_seqs, np.int32), positions=pos,
        seq_starts=np.arange(n_seqs + 1, dtype=np.int32), seq_lens=pos + 1, block_tables=tables,
        slot_mapping=tables[:, (ctx - 1) // bs] * bs + (ctx - 1) % bs,
        logits_indices=np.arange(n_seqs, dtype=np.int32), block_size=bs,
    )
    return batch, n_seqs * per_seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--window", type=int, default=0)
    ap.add_argument("--kv-type", choices=KV_TYPES, default=KV_DEFAULT)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"decode attention, {N_HEADS} q heads / {N_KV} kv head / head_dim {HEAD_DIM}, "
          f"block {args.block_size}, window {args.window}, KV {args.kv_type}, median of {args.repeat}")
    print(f"{'ctx':>6} {'seqs':>5} {'ms/layer':>9} {'us/seq':>8} {'GB/s (K+V)':>11} {'cpu ms':>8}")
    for n_seqs in (1, 16):
        for ctx in (512, 2048, 8192):
            batch, n_blocks = decode_batch(n_seqs, ctx, args.block_size, rng)
            kv = random_kv(n_blocks, args.block_size, args.kv_type, rng)
            q = rng.standard_normal((n_seqs, N_HEADS, HEAD_DIM), dtype=np.float32)
            attention(q, kv, batch, HEAD_DIM**-0.5, window=args.window)  # compile / warm
            times, cpu = [], []
            for _ in range(args.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                attention(q, kv, batch, HEAD_DIM**-0.5, window=args.window)
                times.append(time.perf_counter() - t0)
                cpu.append(time.process_time() - c0)
            t = float(np.median(times))
            keys = min(ctx, args.window) if args.window > 0 else ctx
            gbs = 2 * n_seqs * keys * N_KV * kv_row_bytes(args.kv_type, HEAD_DIM) / t / 1e9
            print(f"{ctx:>6} {n_seqs:>5} {t * 1e3:>9.3f} {t * 1e6 / n_seqs:>8.1f} {gbs:>11.1f} "
                  f"{np.median(cpu) * 1e3:>8.3f}")
    prefill(args, rng)


def random_kv(n_blocks: int, bs: int, kv_type: str, rng):
    """A cache of kv_type whose every slot holds N(0, 1) K and V rows."""
    kv = allocate_kv(n_blocks, bs, N_KV, HEAD_DIM, kv_type)
    shape = (n_blocks * bs, N_KV, HEAD_DIM)
    store_kv(kv, rng.standard_normal(shape, dtype=np.float32), rng.standard_normal(shape, dtype=np.float32),
             np.arange(n_blocks * bs, dtype=np.int32))
    return kv


def prefill(args, rng, n_tokens: int = 512) -> None:
    """One causal prefill of n_tokens (one sequence): attention time per layer."""
    bs = args.block_size
    n_blocks = -(-n_tokens // bs)
    tables = rng.permutation(n_blocks).astype(np.int32)[None, :]
    pos = np.arange(n_tokens, dtype=np.int32)
    batch = Batch(
        token_ids=np.zeros(n_tokens, np.int32), positions=pos,
        seq_starts=np.array([0, n_tokens], np.int32), seq_lens=np.array([n_tokens], np.int32),
        block_tables=tables, slot_mapping=tables[0, pos // bs] * bs + pos % bs,
        logits_indices=np.array([n_tokens - 1], np.int32), block_size=bs,
    )
    kv = random_kv(n_blocks, bs, args.kv_type, rng)
    q = rng.standard_normal((n_tokens, N_HEADS, HEAD_DIM), dtype=np.float32)
    attention(q, kv, batch, HEAD_DIM**-0.5, window=args.window)
    times, cpu = [], []
    for _ in range(max(3, args.repeat // 4)):
        t0, c0 = time.perf_counter(), time.process_time()
        attention(q, kv, batch, HEAD_DIM**-0.5, window=args.window)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    print(f"prefill {n_tokens} tokens (1 sequence, causal): {np.median(times) * 1e3:.3f} ms/layer "
          f"(cpu {np.median(cpu) * 1e3:.3f} ms)")


if __name__ == "__main__":
    main()
