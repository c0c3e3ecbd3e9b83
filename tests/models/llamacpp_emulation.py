"""A numpy Gemma 3 forward that reproduces llama.cpp's CPU roundings, each one switchable.

Used by bench/llamacpp_numerics.py to find which of llama.cpp's roundings its greedy tokens depend
on. Weights are dequantized once with gguf-py (float32, exact for every block type); a matmul is
x' @ W.T in float64, where x' is x rounded the way llama.cpp quantizes activations for that weight
type (its vec_dot_type), so only the order of float additions differs from llama.cpp's integer dots.

    emu = Emulator(path)
    logits = emu.logits(tokens, Numerics(act="ggml", kv_f16=True))   # [len(tokens), vocab]

Switches (Numerics; all off = a float64 forward like tests/models/reference.py):
    act     "f32": no activation rounding; "q8_0": every matmul rounds x per 32 (int8, float16
            scale); "ggml": Q8_0-style for Q4_0/Q5_0/Q8_0 weights, Q8_K (per 256, float scale
            1/(-127/max)) for K-quant weights, as ggml-cpu's type_traits vec_dot_type.
    f32     keep activations in float32 between ops (llama.cpp's tensors are float32).
    norm    "ggml": sum of squares in double, scale = 1/sqrtf(mean + eps), then x*scale*w in float.
    rope    "ggml": theta_i = p * theta_scale^i accumulated in float32, cosf/sinf (ggml_rope_cache_init).
    gelu    "f16": ggml's float16 GELU table (GGML_GELU_FP16) instead of the exact formula.
    kv_f16  K and V cache stored as float16.
    fa      "ggml": flash attention as ggml_compute_forward_flash_attn_ext_f16_one_chunk: Q rounded
            to float16, online softmax in float32, V accumulated in a float16 vector.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import gguf
import numpy as np
from gguf.quants import dequantize

QT = gguf.GGMLQuantizationType
_Q8_0_ACT = {QT.Q4_0, QT.Q4_1, QT.Q5_0, QT.Q5_1, QT.Q8_0}
_Q8_K_ACT = {QT.Q2_K, QT.Q3_K, QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.IQ4_XS}


@dataclass(frozen=True)
class Numerics:
    """Which of llama.cpp's roundings to apply (see the module docstring)."""

    act: str = "f32"
    f32: bool = False
    norm: str = "f64"
    rope: str = "exact"
    gelu: str = "exact"
    kv_f16: bool = False
    fa: str = "exact"
    mm32: bool = False  # matmuls in float32 BLAS (a different float summation order: noise control)


LLAMACPP = Numerics(act="ggml", f32=True, norm="ggml", rope="ggml", gelu="f16", kv_f16=True, fa="ggml")


def f16(x):
    """Round to float16 (nearest even, as F16C) and back to float32."""
    with np.errstate(over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(np.float16).astype(np.float32)


def quant_q8_0(x: np.ndarray) -> np.ndarray:
    """x [n, k] as ggml's quantize_row_q8_0 (x86) sees it: per 32, q = rne(x * 127/amax), value =
    f16(amax/127) * q."""
    n, k = x.shape
    xb = x.astype(np.float32).reshape(n, k // 32, 32)
    amax = np.abs(xb).max(-1, keepdims=True)  # [n, k/32, 1]
    with np.errstate(divide="ignore"):
        idn = np.where(amax > 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(xb * idn)  # float32 product, round half to even
    d = f16(amax / np.float32(127.0))
    return (q.astype(np.float64) * d).reshape(n, k)


def quant_q8_K(x: np.ndarray) -> np.ndarray:
    """x [n, k] as quantize_row_q8_K_ref: per 256, iscale = -127/max (max = the value of largest
    magnitude), q = min(127, rne(iscale * x)), value = (1/iscale) * q."""
    n, k = x.shape
    xb = x.astype(np.float32).reshape(n, k // 256, 256)
    idx = np.abs(xb).argmax(-1)[..., None]
    mx = np.take_along_axis(xb, idx, -1)  # [n, k/256, 1] signed
    with np.errstate(divide="ignore"):
        iscale = np.where(mx != 0, np.float32(-127.0) / mx, np.float32(0.0)).astype(np.float32)
        d = np.where(mx != 0, np.float32(1.0) / iscale, np.float32(0.0)).astype(np.float32)
    q = np.minimum(np.rint(xb * iscale), 127)
    return (q.astype(np.float64) * d).reshape(n, k)


class Emulator:
    """The default model's weights, dequantized to float32, and an emulating forward."""

    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        self.meta = {k: f.contents() for k, f in r.fields.items()}
        self.w, self.qtype = {}, {}
        for t in r.tensors:
            shape = tuple(int(d) for d in reversed(t.shape))
            self.w[t.name] = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
            self.qtype[t.name] = t.tensor_type
        self.wT = {}  # float64 transposes of the layer matrices (small), built lazily

    def m(self, key):
        return self.meta[f"gemma3.{key}"]

    # --- ops ---------------------------------------------------------------------------------
    def cast(self, x, nm: Numerics):
        return x.astype(np.float32) if nm.f32 else x.astype(np.float64)

    def matmul(self, x, name, nm: Numerics):
        """x [n, k] @ W.T with x rounded as llama.cpp's vec_dot_type for W's type."""
        qt = self.qtype[name]
        if nm.act == "q8_0" or (nm.act == "ggml" and qt in _Q8_0_ACT):
            xq = quant_q8_0(x)
        elif nm.act == "ggml" and qt in _Q8_K_ACT:
            xq = quant_q8_K(x)
        else:
            xq = x.astype(np.float64)
        w = self.w[name]
        if nm.mm32 or w.shape[0] > 100000:  # the output projection: float32 BLAS, too big for float64 copies
            return self.cast(xq.astype(np.float32) @ w.T, nm)
        if name not in self.wT:
            self.wT[name] = w.T.astype(np.float64)
        return self.cast(xq @ self.wT[name], nm)

    def norm(self, x, name, nm: Numerics):
        """RMS norm over the last axis times the weight."""
        eps = self.m("attention.layer_norm_rms_epsilon")
        w = self.w[name]
        if nm.norm == "ggml":
            x32 = x.astype(np.float32)
            mean = ((x32 * x32).astype(np.float64).sum(-1, keepdims=True) / x.shape[-1]).astype(np.float32)
            scale = np.float32(1.0) / np.sqrt(mean + np.float32(eps))
            return self.cast((x32 * scale) * w, nm)
        x = x.astype(np.float64)
        return self.cast(x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w, nm)

    def rope(self, x, pos, base, nm: Numerics):
        """NEOX RoPE of x [T, heads, d] at positions pos [T]."""
        T, _, d = x.shape
        if nm.rope == "ggml":
            theta_scale = np.float32(base) ** np.float32(-2.0 / d)
            theta = np.empty((T, d // 2), dtype=np.float32)
            th = pos.astype(np.float32)
            for i in range(d // 2):
                theta[:, i] = th
                th = (th * theta_scale).astype(np.float32)
            c, s = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
            c, s = c[:, None, :], s[:, None, :]
            x = x.astype(np.float32)
            x0, x1 = x[..., : d // 2], x[..., d // 2:]
            out = np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)
            return self.cast(out, nm)
        freqs = base ** (-np.arange(0, d, 2) / d)
        ang = np.outer(pos.astype(np.float64), freqs)[:, None, :]
        c, s = np.cos(ang), np.sin(ang)
        x = x.astype(np.float64)
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
        return self.cast(np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1), nm)

    def gelu_mul(self, g, u, nm: Numerics):
        if nm.gelu == "f16":
            g32 = g.astype(np.float32)
            h = f16(g32)
            t = (np.float32(0.5) * h * (np.float32(1.0) + np.tanh(np.float32(math.sqrt(2 / math.pi)) * h
                 * (np.float32(1.0) + np.float32(0.044715) * h * h)))).astype(np.float32)
            t = f16(t)
            t = np.where(g32 <= -10, np.float32(0), np.where(g32 >= 10, g32, t))
            return self.cast(t * u.astype(np.float32), nm)
        g = g.astype(np.float64)
        gl = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g ** 3)))
        return self.cast(gl * u, nm)

    def attend(self, q, k, v, window, nm: Numerics):
        """Causal GQA attention, q [T, H, d] (already scaled), k/v [T, KVH, d] -> [T, H*d]."""
        T, H, d = q.shape
        rep = H // k.shape[1]
        if nm.kv_f16:
            k, v = f16(k), f16(v)
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        mask = (j <= i) & ((i - j < window) if window else True)
        if nm.fa == "ggml":
            return self.cast(self._fa_ggml(q, k, v, mask), nm)
        s = np.einsum("thd,jhd->htj", q.astype(np.float64), k.astype(np.float64))
        s = np.where(mask[None], s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        return self.cast(np.einsum("htj,jhd->thd", p, v.astype(np.float64)).reshape(T, H * d), nm)

    @staticmethod
    def _fa_ggml(q, k, v, mask):
        """One-chunk CPU flash attention: f16 Q, scores in float32, online softmax over keys in
        order, V summed into a float16 vector (all queries at once; masked keys leave a row as is)."""
        T, H, d = q.shape
        qh = f16(q)  # [T, H, d]
        s_all = np.einsum("thd,jhd->tjh", qh.astype(np.float64), k.astype(np.float64)).astype(np.float32)
        M = np.full((T, H), -np.inf, dtype=np.float32)
        S = np.zeros((T, H), dtype=np.float32)
        acc = np.zeros((T, H, d), dtype=np.float32)  # float16 values held in float32
        one = np.float32(1)
        for j in range(T):
            live = mask[:, j][:, None]  # [T, 1] queries that see key j
            s = s_all[:, j, :]  # [T, H]
            new = (s > M) & live
            with np.errstate(invalid="ignore", over="ignore"):
                ms = np.where(new, np.exp(M - s), one).astype(np.float32)
                vs = np.where(new, one, np.exp(s - M)).astype(np.float32)
            vs = np.where(live, vs, np.float32(0))
            M = np.where(new, s, M)
            acc = np.where(new[..., None], f16(acc * ms[..., None]), acc)
            upd = f16(acc + v[j][None] * vs[..., None])  # fma, then the float16 store
            acc = np.where(live[..., None], upd, acc)
            S = np.where(live, (S * ms + vs).astype(np.float32), S)
        return (acc * (one / S)[..., None]).reshape(T, H * d)

    # --- the model -------------------------------------------------------------------------------
    def logits(self, tokens, nm: Numerics = Numerics(), trace: dict | None = None) -> np.ndarray:
        """Logits of every position of one sequence from position 0: [len(tokens), vocab].

        trace: if given, filled with {llama.cpp graph node name: sum of its values} per layer
        (names as llama-eval-callback prints them), to find where a forward departs from it."""
        tokens = np.asarray(tokens)

        def cb(name, a):
            if trace is not None:
                trace[name] = float(np.asarray(a, dtype=np.float64).sum())
            return a
        T = len(tokens)
        H, KVH = self.m("attention.head_count"), self.m("attention.head_count_kv")
        d = self.m("attention.key_length")
        n_embd, window = self.m("embedding_length"), self.m("attention.sliding_window")
        pos = np.arange(T)
        x = self.cast(self.w["token_embd.weight"][tokens] * np.float32(math.sqrt(n_embd)), nm)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            local = (il + 1) % 6 != 0
            base = 10000.0 if local else self.m("rope.freq_base")
            h = cb(f"attn_norm-{il}", self.norm(x, p + "attn_norm.weight", nm))
            q = cb(f"Qcur-{il}", self.matmul(h, p + "attn_q.weight", nm)).reshape(T, H, d)
            k = cb(f"Kcur-{il}", self.matmul(h, p + "attn_k.weight", nm)).reshape(T, KVH, d)
            v = cb(f"Vcur-{il}", self.matmul(h, p + "attn_v.weight", nm)).reshape(T, KVH, d)
            q = self.rope(self.norm(q, p + "attn_q_norm.weight", nm), pos, base, nm)
            k = self.rope(self.norm(k, p + "attn_k_norm.weight", nm), pos, base, nm)
            q = q * (1.0 / math.sqrt(d))  # a power of two for head_dim 256: exact
            o = cb(f"kqv_out-{il}", self.attend(q, k, v, window if local else 0, nm))
            o = cb(f"attn_out-{il}", self.matmul(o, p + "attn_output.weight", nm))
            x = cb(f"sa_out-{il}", self.cast(x + self.norm(o, p + "post_attention_norm.weight", nm), nm))
            h = cb(f"ffn_norm-{il}", self.norm(x, p + "ffn_norm.weight", nm))
            g = cb(f"ffn_gate-{il}", self.matmul(h, p + "ffn_gate.weight", nm))
            u = cb(f"ffn_up-{il}", self.matmul(h, p + "ffn_up.weight", nm))
            gu = cb(f"ffn_geglu-{il}", self.gelu_mul(g, u, nm))
            f = cb(f"ffn_out-{il}", self.matmul(gu, p + "ffn_down.weight", nm))
            x = cb(f"l_out-{il}", self.cast(x + self.norm(f, p + "post_ffw_norm.weight", nm), nm))
        x = self.norm(x, "output_norm.weight", nm)
        return self.matmul(x, "token_embd.weight", nm).astype(np.float64)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def score_teacher_forced(logits_fn, cases) -> dict:
    """Feed each prompt + llama.cpp's own continuation; a case 'matches' when every step's argmax
    equals llama.cpp's token (then greedy decoding reproduces all its tokens). Returns the count,
    the worst top-1 logprob difference up to each case's first departure, and per-case detail."""
    matched, worst, detail, diffs, agree = 0, 0.0, [], [], 0
    for c in cases:
        seq = c["prompt_ids"] + c["ids"][:-1]
        lg = logits_fn(seq)[len(c["prompt_ids"]) - 1:]  # [32, vocab]
        lp = log_softmax(lg)
        first, dmax = None, 0.0
        for i, step in enumerate(c["steps"]):
            d = abs(lp[i, step["top"][0][0]] - step["top"][0][1])
            diffs.append(d)
            hit = int(np.argmax(lp[i])) == c["ids"][i]
            agree += hit
            if first is None:
                dmax = max(dmax, d)
                if not hit:
                    first = i
        matched += first is None
        worst = max(worst, dmax)
        detail.append((first, round(float(dmax), 3)))
    diffs = np.array(diffs)
    return {"matched": matched, "worst": worst, "detail": detail, "agree": agree,
            "mean": float(diffs.mean()), "p90": float(np.quantile(diffs, 0.9))}
