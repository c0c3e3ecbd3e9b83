"""The structured-output bench's pieces run on a tiny vocabulary (the full run is `run()`)."""

import json

import jsonschema

from edged.bench.structured import BENCH_DOCS, BENCH_SCHEMA, _batch_times, _kernel_times, _mask_times, cpu_model


def test_bench_pieces(tiny_bpe):
    for doc in BENCH_DOCS:
        jsonschema.validate(doc, BENCH_SCHEMA)
    ll = tiny_bpe.ll
    times = _mask_times(ll, ll.tokenize_str, BENCH_SCHEMA, n_sampled=1, seed=0)
    n_doc_tokens = sum(len(ll.tokenize_str(json.dumps(d, ensure_ascii=False))) for d in BENCH_DOCS)
    assert len(times) > n_doc_tokens  # every document token timed, then a sampled generation
    assert all(w >= 0 and c >= 0 for w, c in times)
    assert len(_batch_times(ll, ll.tokenize_str, BENCH_SCHEMA, batch=3)) > 0
    assert len(_kernel_times(ll.vocab_size, 2, 3)) == 3
    assert cpu_model()
