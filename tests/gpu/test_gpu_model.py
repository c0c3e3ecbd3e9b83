"""The default model's real tensors (Gemma 3 270M Q4_K_M) through the CUDA kernels vs the CPU backend."""

import numpy as np

from edged.backends import cpu
from edged.quant.gguf import load_gguf
from tests.backends.cuda.checks import MATMUL_RTOL, matmul_reference, ops
from tests.helpers.model import default_model_path
from tests.helpers.qdata import reference_dequantize


def test_real_tensors_match_cpu():
    o = ops()
    gf = load_gguf(default_model_path())
    try:
        seen = {}
        for t in gf.tensors.values():  # one 2-D tensor of each quantized type, plus the output/embedding table
            if len(t.shape) == 2 and t.qtype not in seen and t.qtype.name != "F32":
                seen[t.qtype] = t
        assert len(seen) >= 3, f"expected several quantized types, found {[q.name for q in seen]}"
        rng = np.random.default_rng(0)
        for w in seen.values():
            wd = o.upload_matrix(w)
            wmax = float(np.abs(reference_dequantize(w)).max()) if w.n_rows <= 8192 else None
            # n = 1 against the CPU kernel (gemv), 16 against its numerics in numpy (not for the
            # 262144-row table: its float64 copy would take 1.3 GB)
            for n in ((1,) if wmax is None else (1, 16)):
                x = rng.standard_normal((n, w.n_cols)).astype(np.float32)
                y = o.to_host(o.matmul(wd, o.upload(x)))
                if n == 1 or wmax is None:
                    want = cpu.matmul(w, x)
                else:
                    want = matmul_reference(w, x, reference_dequantize(w))
                if wmax is None:  # the 262144-row table: bound by the largest output instead
                    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5 * float(np.abs(want).max()), err_msg=w.name)
                else:
                    bound = MATMUL_RTOL * (np.abs(want) + np.abs(x).sum(1, keepdims=True) * wmax)
                    assert np.all(np.abs(y - want) <= bound), w.name
        emb = gf.tensors["token_embd.weight"]
        ids = np.array([2, 0, 262143, 105, 9259], dtype=np.int32)
        got = o.to_host(o.embed(o.upload_matrix(emb), ids))
        np.testing.assert_array_equal(got, cpu.embed(emb, ids))
    finally:
        gf.close()


def test_default_model_on_the_device_gives_the_cpu_tokens():
    """Every layer and the output on the CUDA ops: the host's greedy tokens. A 4-token prompt keeps
    the CPU side on its gemv kernels (quick to compile from a cold cache)."""
    from edged.models import load_model
    from tests.models.driver import greedy

    o = ops()
    gf = load_gguf(default_model_path())
    try:
        prompt = [2, 818, 5279, 529]
        ref = greedy(load_model(gf), prompt, 6)
        model = load_model(gf)
        model.place([o] * model.n_layers, o)
        got = greedy(model, prompt, 6)
        assert got.ids == ref.ids
        for a, b in zip(got.steps, ref.steps):
            np.testing.assert_allclose([p for _, p in a], [p for _, p in b], atol=2e-3)
    finally:
        gf.close()
