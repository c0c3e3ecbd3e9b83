"""Per-request block tables over the shared BlockPool, with automatic prefix caching."""

from __future__ import annotations

from edged.kv.block_pool import BlockPool, hash_block


class KVCacheManager:
    """Maps each request to the blocks holding its KV; reuses cached full blocks of its prefix."""

    def __init__(self, pool: BlockPool):
        self.pool = pool
        self.block_size = pool.block_size
        self.tables: dict[str, list[int]] = {}
        self._hashes: dict[str, list[bytes]] = {}  # chained hashes of the request's cached full blocks
        self.prefix_queries = 0  # tokens looked up in the prefix cache
        self.prefix_hits = 0  # tokens found there

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def table(self, request_id: str) -> list[int]:
        return self.tables.get(request_id, [])

    def claim_cached_prefix(self, request_id: str, token_ids: list[int]) -> int:
        """Give a new request every cached full block of its prefix; returns the tokens covered.

        At least one token is left uncached so the step that completes the prompt has logits.
        """
        table = self.tables.setdefault(request_id, [])
        hashes = self._hashes.setdefault(request_id, [])
        assert not table, "prefix is claimed once, before any allocation"
        bs = self.block_size
        max_blocks = (len(token_ids) - 1) // bs
        parent = None
        for i in range(max_blocks):
            h = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            block = self.pool.lookup(h)
            if block is None:
                break
            self.pool.touch(block)
            table.append(block)
            hashes.append(h)
            parent = h
        hit = len(table) * bs
        self.prefix_queries += len(token_ids)
        self.prefix_hits += hit
        return hit

    def allocate(self, request_id: str, num_tokens: int) -> bool:
        """Grow the request's table to hold num_tokens tokens; False (nothing taken) if short."""
        table = self.tables.setdefault(request_id, [])
        self._hashes.setdefault(request_id, [])
        need = self.blocks_needed(num_tokens) - len(table)
        if need > self.pool.num_free:
            return False
        for _ in range(need):
            table.append(self.pool.allocate())
        return True

    def cache_full_blocks(self, request_id: str, token_ids: list[int], num_computed: int) -> None:
        """Register the hashes of the request's blocks whose tokens are all computed."""
        if not self.pool.enable_prefix_cache:
            return
        table = self.tables[request_id]
        hashes = self._hashes[request_id]
        bs = self.block_size
        for i in range(len(hashes), min(num_computed // bs, len(table))):
            parent = hashes[-1] if hashes else None
            h = hash_block(parent, token_ids[i * bs : (i + 1) * bs])
            self.pool.cache(table[i], h)
            hashes.append(h)

    def free(self, request_id: str) -> None:
        """Release all of a request's blocks (tail first, so shared prefixes are evicted last)."""
        table = self.tables.pop(request_id, None)
        self._hashes.pop(request_id, None)
        if table:
            self.pool.free(reversed(table))

    @property
    def prefix_hit_rate(self) -> float:
        return self.prefix_hits / self.prefix_queries if self.prefix_queries else 0.0
