"""MatcherCache: one compile per grammar, independent pristine copies, errors kept and re-raised
with each request's own field, LRU bound."""

import numpy as np
import pytest

from edged.structured import ConstraintError, MatcherCache, allocate_bitmask, constraint_from_request
from edged.structured.forms import schema_constraint


def test_copies_are_pristine_and_independent(tiny_bpe):
    cache = MatcherCache(tiny_bpe.ll)
    c = constraint_from_request({"json_schema": {"type": "object", "properties": {"a": {"type": "integer"}}}})
    m1 = cache.matcher(c)
    for t in tiny_bpe.byte_tokens(b'{"a": 1'):
        assert m1.consume(t)
    m2 = cache.matcher(c)  # not affected by m1's tokens
    assert len(cache) == 1 and m2.n_consumed == 0
    bm1, bm2 = allocate_bitmask(1, m1.vocab_size), allocate_bitmask(1, m1.vocab_size)
    m2.fill_mask(bm2, 0)
    m1.fill_mask(bm1, 0)
    assert not np.array_equal(bm1, bm2)
    assert m2.consume(tiny_bpe.byte_id[b"{"]) and not m2.consume(tiny_bpe.byte_id[b"{"])
    assert not m1.is_error()


def test_errors_cached_with_request_field(tiny_bpe):
    cache = MatcherCache(tiny_bpe.ll)
    for field in ("json_schema", "tools[1].function.parameters"):
        with pytest.raises(ConstraintError) as ei:
            cache.matcher(schema_constraint({"type": "strin"}, field))
        assert ei.value.field == field and "strin" in ei.value.message
    assert len(cache) == 1


def test_lru_bound(tiny_bpe):
    cache = MatcherCache(tiny_bpe.ll, max_entries=3)
    for i in range(5):
        cache.matcher(schema_constraint({"const": i}, "json_schema"))
    assert len(cache) == 3
