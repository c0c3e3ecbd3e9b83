"""Independent float64 numpy forward passes of each architecture, for testing the model code.

Reads the GGUF with gguf-py's own reader and dequantizer (not edged's loader nor edged.models),
keeps every weight dense, and runs one sequence at a time with unpaged causal attention.

    ref = ReferenceModel(path)
    logits = ref.logits([2, 17, 40])      # float64 [3, vocab]: one row per position
"""

import math

import gguf
import numpy as np
from gguf.quants import dequantize

from tests.helpers.rope_reference import Yarn, rope_frequencies


class ReferenceModel:
    """A GGUF model held as float64 arrays, with a plain forward per architecture."""

    def __init__(self, path):
        r = gguf.GGUFReader(str(path))
        self.meta = {k: f.contents() for k, f in r.fields.items()}
        self.arch = self.meta["general.architecture"]
        self.w = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape(
            tuple(int(d) for d in reversed(t.shape))) for t in r.tensors}

    def m(self, suffix, default=None):
        return self.meta.get(f"{self.arch}.{suffix}", default)

    def logits(self, tokens) -> np.ndarray:
        """Logits of every position of one sequence starting at position 0: [len(tokens), vocab]."""
        fwd = {"gemma3": self._gemma3, "gemma2": self._gemma2, "llama": self._llama, "mistral": self._llama,
               "qwen2": self._llama, "qwen3": self._llama, "qwen3moe": self._llama,
               "phi3": self._phi3, "gpt-oss": self._gpt_oss}[self.arch]
        return fwd(np.asarray(tokens))

    # --- building blocks ---------------------------------------------------------------------
    def norm(self, x, name):
        eps = self.m("attention.layer_norm_rms_epsilon")
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * self.w[name]

    @staticmethod
    def rope(x, base, neox, scale=1.0, factors=None, yarn=None):
        """x [T, heads, d]: rotate (i, i+d/2) pairs (neox) or (2i, 2i+1) pairs, via complex numbers;
        yarn: a tests.helpers.rope_reference.Yarn (its frequencies and cos/sin scale)."""
        T, _, d = x.shape
        freqs, mscale = rope_frequencies(d, base, scale, factors, yarn)
        rot = mscale * np.exp(1j * np.outer(np.arange(T), freqs))[:, None, :]  # [T, 1, d/2]
        if neox:
            z = (x[..., : d // 2] + 1j * x[..., d // 2 :]) * rot
            return np.concatenate([z.real, z.imag], axis=-1)
        z = (x[..., 0::2] + 1j * x[..., 1::2]) * rot
        out = np.empty_like(x)
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
        return out

    @staticmethod
    def attend(q, k, v, scale, window=0, softcap=0.0, sinks=None):
        """Dense causal GQA attention: q [T, H, d], k/v [T, KVH, d] -> [T, H*d]; sinks [H]: one
        more logit per head in the softmax's denominator (gpt-oss), attending to nothing."""
        T, H, d = q.shape
        rep = H // k.shape[1]
        k, v = np.repeat(k, rep, axis=1), np.repeat(v, rep, axis=1)
        s = np.einsum("thd,jhd->htj", q, k) * scale
        if softcap:
            s = softcap * np.tanh(s / softcap)
        i, j = np.arange(T)[:, None], np.arange(T)[None, :]
        mask = (j <= i) & ((i - j < window) if window else True)
        s = np.where(mask[None], s, -np.inf)
        mx = s.max(-1, keepdims=True)
        if sinks is not None:
            mx = np.maximum(mx, sinks[:, None, None])
        p = np.exp(s - mx)
        denom = p.sum(-1, keepdims=True)
        if sinks is not None:
            denom = denom + np.exp(sinks[:, None, None] - mx)
        return np.einsum("htj,jhd->thd", p / denom, v).reshape(T, H * d)

    def yarn(self):
        """The file's YaRN scaling (rope.scaling.type "yarn"), or None."""
        if self.m("rope.scaling.type") != "yarn":
            return None
        return Yarn(factor=self.m("rope.scaling.factor"),
                    orig_ctx=self.m("rope.scaling.original_context_length", self.m("context_length")),
                    beta_fast=self.m("rope.scaling.yarn_beta_fast", 32.0),
                    beta_slow=self.m("rope.scaling.yarn_beta_slow", 1.0),
                    attn_factor=self.m("rope.scaling.attn_factor", 1.0))

    def output(self, x):
        x = self.norm(x, "output_norm.weight")
        return x @ self.w.get("output.weight", self.w["token_embd.weight"]).T

    # --- architectures -------------------------------------------------------------------------
    def _heads(self):
        H, KVH = self.m("attention.head_count"), self.m("attention.head_count_kv")
        d = self.m("attention.key_length", self.m("embedding_length") // H)
        return H, KVH, d

    def _gemma3(self, tokens):
        H, KVH, d = self._heads()
        n_embd, window = self.m("embedding_length"), self.m("attention.sliding_window", 0)
        x = self.w["token_embd.weight"][tokens] * math.sqrt(n_embd)
        T = len(tokens)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            local = window and (il % 6) != 5
            base = 10000.0 if local else self.m("rope.freq_base")
            h = self.norm(x, p + "attn_norm.weight")
            q = (h @ self.w[p + "attn_q.weight"].T).reshape(T, H, d)
            k = (h @ self.w[p + "attn_k.weight"].T).reshape(T, KVH, d)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, KVH, d)
            q = self.rope(self.norm(q, p + "attn_q_norm.weight"), base, True)
            k = self.rope(self.norm(k, p + "attn_k_norm.weight"), base, True)
            o = self.attend(q, k, v, 1 / math.sqrt(d), window if local else 0) @ self.w[p + "attn_output.weight"].T
            x = x + self.norm(o, p + "post_attention_norm.weight")
            h = self.norm(x, p + "ffn_norm.weight")
            g = h @ self.w[p + "ffn_gate.weight"].T
            gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
            f = (gelu * (h @ self.w[p + "ffn_up.weight"].T)) @ self.w[p + "ffn_down.weight"].T
            x = x + self.norm(f, p + "post_ffw_norm.weight")
        return self.output(x)

    def _gemma2(self, tokens):
        """Gemma 3's block without q/k norms; even layers local; one RoPE; both logit softcaps."""
        H, KVH, d = self._heads()
        n_embd, window = self.m("embedding_length"), self.m("attention.sliding_window", 4096)
        attn_cap, final_cap = self.m("attn_logit_softcapping", 50.0), self.m("final_logit_softcapping", 30.0)
        x = self.w["token_embd.weight"][tokens] * math.sqrt(n_embd)
        T = len(tokens)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            h = self.norm(x, p + "attn_norm.weight")
            q = self.rope((h @ self.w[p + "attn_q.weight"].T).reshape(T, H, d), self.m("rope.freq_base"), True)
            k = self.rope((h @ self.w[p + "attn_k.weight"].T).reshape(T, KVH, d), self.m("rope.freq_base"), True)
            v = (h @ self.w[p + "attn_v.weight"].T).reshape(T, KVH, d)
            o = self.attend(q, k, v, 1 / math.sqrt(d), window if il % 2 == 0 else 0, attn_cap)
            x = x + self.norm(o @ self.w[p + "attn_output.weight"].T, p + "post_attention_norm.weight")
            h = self.norm(x, p + "ffn_norm.weight")
            g = h @ self.w[p + "ffn_gate.weight"].T
            gelu = 0.5 * g * (1 + np.tanh(math.sqrt(2 / math.pi) * (g + 0.044715 * g**3)))
            f = (gelu * (h @ self.w[p + "ffn_up.weight"].T)) @ self.w[p + "ffn_down.weight"].T
            x = x + self.norm(f, p + "post_ffw_norm.weight")
        return final_cap * np.tanh(self.output(x) / final_cap)

    def _llama(self, tokens):
        """llama / qwen2 (biases) / qwen3 (q/k norms) / qwen3moe (experts): pre-norm, SiLU gated FFN."""
        H, KVH, d = self._heads()
        neox = self.arch in ("qwen2", "qwen3", "qwen3moe")  # llama / mistral: interleaved pairs
        scale = 1.0 / self.m("rope.scaling.factor", 1.0) if self.m("rope.scaling.type") == "linear" else 1.0
        factors = self.w.get("rope_freqs.weight")
        yarn = self.yarn()
        x = self.w["token_embd.weight"][tokens]
        T = len(tokens)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            h = self.norm(x, p + "attn_norm.weight")
            q, k, v = (h @ self.w[p + f"attn_{n}.weight"].T + self.w.get(p + f"attn_{n}.bias", 0.0)
                       for n in "qkv")
            q, k, v = q.reshape(T, H, d), k.reshape(T, KVH, d), v.reshape(T, KVH, d)
            if p + "attn_q_norm.weight" in self.w:
                q, k = self.norm(q, p + "attn_q_norm.weight"), self.norm(k, p + "attn_k_norm.weight")
            q = self.rope(q, self.m("rope.freq_base"), neox, scale, factors, yarn)
            k = self.rope(k, self.m("rope.freq_base"), neox, scale, factors, yarn)
            x = x + self.attend(q, k, v, 1 / math.sqrt(d)) @ self.w[p + "attn_output.weight"].T
            h = self.norm(x, p + "ffn_norm.weight")
            if p + "ffn_gate_inp.weight" in self.w:
                x = x + self._qwen3moe_experts(h, p)
                continue
            g = h @ self.w[p + "ffn_gate.weight"].T
            x = x + (g / (1 + np.exp(-g)) * (h @ self.w[p + "ffn_up.weight"].T)) @ self.w[p + "ffn_down.weight"].T
        return self.output(x)

    def _qwen3moe_experts(self, h, p):
        """One token and one chosen expert at a time: softmax over all experts, the top
        expert_used_count (ties to the lower id), their weights renormalised to sum 1, SwiGLU."""
        k = self.m("expert_used_count")
        logits = h @ self.w[p + "ffn_gate_inp.weight"].T  # [T, n_expert]
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        gate, up, down = (self.w[p + f"ffn_{n}_exps.weight"] for n in ("gate", "up", "down"))
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            top = np.argsort(-probs[t], kind="stable")[:k]
            for e, wt in zip(top, probs[t, top] / probs[t, top].sum()):
                g = gate[e] @ h[t]
                out[t] += wt * (down[e] @ (g / (1 + np.exp(-g)) * (up[e] @ h[t])))
        return out

    def _phi3(self, tokens):
        """Fused qkv and gate|up projections, NEOX RoPE, no sliding window (as llama.cpp)."""
        H, KVH, d = self._heads()
        x = self.w["token_embd.weight"][tokens]
        T = len(tokens)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            h = self.norm(x, p + "attn_norm.weight")
            qkv = h @ self.w[p + "attn_qkv.weight"].T
            q, k, v = np.split(qkv, [H * d, (H + KVH) * d], axis=1)
            q = self.rope(q.reshape(T, H, d), self.m("rope.freq_base"), True)
            k = self.rope(k.reshape(T, KVH, d), self.m("rope.freq_base"), True)
            x = x + self.attend(q, k, v.reshape(T, KVH, d), 1 / math.sqrt(d)) @ self.w[p + "attn_output.weight"].T
            h = self.norm(x, p + "ffn_norm.weight")
            g, u = np.split(h @ self.w[p + "ffn_up.weight"].T, 2, axis=1)
            x = x + (g / (1 + np.exp(-g)) * u) @ self.w[p + "ffn_down.weight"].T
        return self.output(x)

    def _gpt_oss(self, tokens):
        """gpt-oss: biased q/k/v/o, NEOX RoPE with YaRN, sinks, a window on the layers
        il % pattern < pattern - 1; then per token the top expert_used_count router logits (+ bias;
        ties to the lower id), softmax over those, each expert's clamped SwiGLU with its biases."""
        H, KVH, d = self._heads()
        window, pattern = self.m("attention.sliding_window"), self.m("attention.sliding_window_pattern", 2)
        base, yarn = self.m("rope.freq_base"), self.yarn()
        x = self.w["token_embd.weight"][tokens]
        T = len(tokens)
        for il in range(self.m("block_count")):
            p = f"blk.{il}."
            h = self.norm(x, p + "attn_norm.weight")
            q, k, v = (h @ self.w[p + f"attn_{n}.weight"].T + self.w[p + f"attn_{n}.bias"] for n in "qkv")
            q = self.rope(q.reshape(T, H, d), base, True, yarn=yarn)
            k = self.rope(k.reshape(T, KVH, d), base, True, yarn=yarn)
            local = il % pattern < pattern - 1
            o = self.attend(q, k, v.reshape(T, KVH, d), 1 / math.sqrt(d), window if local else 0,
                            sinks=self.w[p + "attn_sinks.weight"])
            x = x + o @ self.w[p + "attn_output.weight"].T + self.w[p + "attn_output.bias"]
            x = x + self._gpt_oss_experts(self.norm(x, p + "post_attention_norm.weight"), p)
        return self.output(x)

    def _gpt_oss_experts(self, h, p, alpha=1.702, limit=7.0):
        k = self.m("expert_used_count")
        logits = h @ self.w[p + "ffn_gate_inp.weight"].T + self.w[p + "ffn_gate_inp.bias"]  # [T, n_expert]
        w = {n: (self.w[p + f"ffn_{n}_exps.weight"], self.w[p + f"ffn_{n}_exps.bias"]) for n in ("gate", "up", "down")}
        out = np.zeros_like(h)
        for t in range(h.shape[0]):
            top = np.argsort(-logits[t], kind="stable")[:k]
            wt = np.exp(logits[t, top] - logits[t, top].max())
            for e, c in zip(top, wt / wt.sum()):
                g = np.minimum(w["gate"][0][e] @ h[t] + w["gate"][1][e], limit)
                u = np.clip(w["up"][0][e] @ h[t] + w["up"][1][e], -limit, limit)
                out[t] += c * (w["down"][0][e] @ (g / (1 + np.exp(-alpha * g)) * (u + 1)) + w["down"][1][e])
        return out
