"""Per-request block tables over one or two BlockPools, with automatic prefix caching.

A model whose layers all attend globally has one KV group: one pool, one table per request. A model
with sliding-window layers (Gemma 3: 5 of 6 layers look back 512 tokens) has a second group for
those layers, with its own pool and tables (the same logical block index i = positions
[i*bs, (i+1)*bs)); blocks that fall out of the window are released as the request advances, and
their table entries become -1 (the attention kernels never read before a token's window).
"""

from __future__ import annotations

from edged.kv.block_pool import BlockPool, hash_block


class KVGroup:
    """Layers sharing one pool and one block table per request; window > 0 frees old blocks."""

    def __init__(self, pool: BlockPool, window: int = 0):
        self.pool = pool
        self.window = window
        self.tables: dict[str, list[int]] = {}  # request id -> block ids (-1: released)

    def first_needed_block(self, num_tokens: int) -> int:
        """Index of the first block a token at position num_tokens still attends to."""
        if not self.window:
            return 0
        return max(0, num_tokens - self.window + 1) // self.pool.block_size

    def release(self, request_id: str) -> None:
        """Drop every block the request holds, tail first (shared prefixes are evicted last)."""
        table = self.tables.pop(request_id, None)
        if table:
            self.pool.free(b for b in reversed(table) if b >= 0)


class KVCacheManager:
    """Maps each request to the blocks holding its KV; reuses cached full blocks of its prefix.

    pool: the main group, whose tables the batch carries as block_tables (the full-attention
    layers; with `window` and no `window_pool`, a model whose every layer is sliding).
    window_pool: the sliding-window layers' group (window > 0), carried as window_block_tables.
    """

    def __init__(self, pool: BlockPool, window: int = 0, window_pool: BlockPool | None = None):
        if window_pool is not None and window < 1:
            raise ValueError("a window pool needs a window > 0")
        if window_pool is not None and window_pool.block_size != pool.block_size:
            raise ValueError("both KV groups must use the same block size")
        self.pool = pool
        self.window_pool = window_pool
        self.window = window
        self.block_size = pool.block_size
        main = KVGroup(pool, window if window_pool is None else 0)
        self.groups = [main] if window_pool is None else [main, KVGroup(window_pool, window)]
        self._hashes: dict[str, list[bytes]] = {}  # chained hashes of the request's computed full blocks
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # tokens found there

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        """The main group's block table."""
        return self.groups[0].tables.get(request_id, [])

    def window_table(self, request_id: str) -> list[int] | None:
        """The sliding-window group's block table (-1 before the window); None with one group."""
        if len(self.groups) == 1:
            return None
        return self.groups[1].tables.get(request_id, [])

    @property
    def capacity_tokens(self) -> int | None:
        """Most tokens one request can hold: the main pool's size, or None when every layer is
        sliding (the pool then only bounds the window, not the context)."""
        main = self.groups[0]
        return None if main.window else main.pool.num_blocks * self.block_size

    def claim_cached_prefix(self, request_id: str, token_ids: list[int]) -> int:
        """Give a new request the cached blocks of its longest usable prefix; returns its tokens.

        A hit of L tokens needs a full-attention group's blocks for [0, L) and a sliding group's
        for [L - window + 1, L) (earlier entries stay -1). At least one token is left uncached so
        the step that completes the prompt has logits.
        """
        assert request_id not in self._hashes, "prefix is claimed once, before any allocation"
        bs = self.block_size
        hashes: list[bytes] = []
        parent = None
        for i in range((len(token_ids) - 1) // bs if self.pool.enable_prefix_cache else 0):
            parent = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            hashes.append(parent)
        found = [[g.pool.lookup(h) for h in hashes] for g in self.groups]  # [groups][blocks]
        k = self._longest_hit(found, len(hashes))
        for g, blocks in zip(self.groups, found):
            first = g.first_needed_block(k * bs)
            table = [-1] * first + blocks[first:k]
            for b in table[first:]:
                g.pool.touch(b)
            g.tables[request_id] = table
        self._hashes[request_id] = hashes[:k]
        self.prefix_queries += len(token_ids)
        self.prefix_hits += k * bs
        return k * bs

    def _longest_hit(self, found: list[list[int | None]], max_blocks: int) -> int:
        """Most blocks k such that every group has the blocks a hit of k blocks needs."""
        best = max_blocks
        sliding = []  # (group, runs): runs[i] = cached blocks in a row ending at block i
        for g, blocks in zip(self.groups, found):
            if not g.window:  # a prefix: stop at the first miss
                best = min(best, next((i for i, b in enumerate(blocks) if b is None), len(blocks)))
                continue
            runs, run = [], 0
            for b in blocks:
                run = run + 1 if b is not None else 0
                runs.append(run)
            sliding.append((g, runs))
        bs = self.block_size
        for k in range(best, 0, -1):
            if all(runs[k - 1] >= k - g.first_needed_block(k * bs) for g, runs in sliding):
                return k
        return 0

    def allocate(self, request_id: str, num_tokens: int, reserve: int = 0) -> bool:
        """Grow the request's tables to hold num_tokens tokens; False (nothing taken) if any group
        is short, or would keep fewer than `reserve` free blocks (room others still need)."""
        self._hashes.setdefault(request_id, [])
        n = self.blocks_needed(num_tokens)
        tables = [g.tables.setdefault(request_id, []) for g in self.groups]
        if any(n - len(t) > g.pool.num_free - reserve for g, t in zip(self.groups, tables)):
            return False
        for g, t in zip(self.groups, tables):
            t.extend(g.pool.allocate() for _ in range(n - len(t)))
        return True

    def cache_full_blocks(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """Register the hashes of the request's blocks whose tokens are all computed."""
        if not self.pool.enable_prefix_cache:
            return
        hashes = self._hashes[request_id]
        bs = self.block_size
        for i in range(len(hashes), min(num_computed // bs, len(self.table(request_id)))):
            parent = hashes[-1] if hashes else None
            h = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            for g in self.groups:
                block = g.tables[request_id][i]
                if block >= 0:
                    g.pool.cache(block, h)
            hashes.append(h)

    def free_outside_window(self, request_id: str, num_computed: int) -> None:
        """Release the sliding groups' blocks no later token attends to (positions before
        num_computed - window + 1), oldest first so they are also evicted first."""
        for g in self.groups:
            if not g.window:
                continue
            table = g.tables[request_id]
            # entries before the last release are all -1: walk back only over the new stale run
            i = min(g.first_needed_block(num_computed), len(table)) - 1
            stale = []
            while i >= 0 and table[i] >= 0:
                stale.append(i)
                i -= 1
            stale.reverse()
            g.pool.free(table[i] for i in stale)
            for i in stale:
                table[i] = -1

    def truncate(self, request_id: str, num_tokens: int) -> None:
        """Release the blocks past the first num_tokens tokens (rejected draft tokens' slots: they
        were never computed validly, so never cached), last block first."""
        keep = self.blocks_needed(num_tokens)
        for g in self.groups:
            table = g.tables.get(request_id)
            if table is not None and len(table) > keep:
                g.pool.free(b for b in reversed(table[keep:]) if b >= 0)
                del table[keep:]

    def free(self, request_id: str) -> None:
        """Release all of a request's blocks in every group."""
        for g in self.groups:
            g.release(request_id)
        self._hashes.pop(request_id, None)

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
