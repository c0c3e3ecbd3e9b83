"""The KV block pool: block ids, ref counts, an LRU free queue and prefix-cache hashes.

It holds no tensors: the backend's KV slabs are indexed by the block ids handed out here. A block
whose ref count drops to zero keeps its hash and stays reusable by a later request with the same
prefix until the free queue hands it out again (least recently freed first).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

import numpy as np


def hash_block(parent: bytes | None, token_ids) -> bytes:
    """Chained SHA-256 of a full block: the hash of the parent block plus this block's token ids."""
    h = hashlib.sha256(parent or b"\0" * 32)
    h.update(np.asarray(token_ids, dtype=np.int64).tobytes())
    return h.digest()


class KVExhausted(RuntimeError):
    """No free block is left in the pool."""


class BlockPool:
    """Fixed-size blocks with ref counts; free blocks kept in LRU order for eviction."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_cache = enable_prefix_cache
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self._cached: dict[bytes, int] = {}  # hash -> block id (in use or free)

    # -- queries -------------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        """Blocks with no owner (including cached ones that may be evicted)."""
        return len(self._free)

    @property
    def num_cached_free(self) -> int:
        """Free blocks that still hold a reusable prefix."""
        return sum(1 for b in self._free if self.block_hash[b] is not None)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def lookup(self, block_hash: bytes) -> int | None:
        """The block holding this prefix hash, if cached."""
        if not self.enable_prefix_cache:
            return None
        return self._cached.get(block_hash)

    # -- ownership ------------------------------------------------------------------------------
    def allocate(self) -> int:
        """Take the least recently freed block, evicting its cached prefix if it had one."""
        if not self._free:
            raise KVExhausted("KV block pool exhausted")
        block, _ = self._free.popitem(last=False)
        old = self.block_hash[block]
        if old is not None:
            if self._cached.get(old) == block:
                del self._cached[old]
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block

    def touch(self, block: int) -> None:
        """Take one more reference to a (possibly free, cached) block."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def free(self, blocks) -> None:
        """Drop one reference to each block; pass a sequence's blocks tail-first so that its
        later blocks (least likely to be shared) are evicted first."""
        for block in blocks:
            rc = self.ref_counts[block]
            if rc <= 0:
                raise ValueError(f"double free of KV block {block}")
            self.ref_counts[block] = rc - 1
            if rc == 1:
                self._free[block] = None

    def cache(self, block: int, block_hash: bytes) -> None:
        """Record that a full, in-use block holds the prefix with this hash."""
        if not self.enable_prefix_cache or self.block_hash[block] is not None:
            return
        self.block_hash[block] = block_hash
        self._cached.setdefault(block_hash, block)
