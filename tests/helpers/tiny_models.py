"""Tiny random GGUF models, one per supported architecture, written with gguf.GGUFWriter.

Realistic metadata (the keys real converters write), weights in a mix of types (F32, F16, Q8_0,
Q5_0, Q4_0, Q4_K, Q6_K) and a minimal tokenizer vocabulary (SentencePiece-style for gemma3 / gemma2 /
llama / phi3, byte-level BPE for qwen2 / qwen3 / qwen3moe) so CLI tests can use the files too. gemma2 also has
Gemma's turn tokens and its real chat template, as converted Gemma 2 files do.

    path = write_tiny_model(tmp_path / "m.gguf", "gemma3", sliding_window=4)
"""

from dataclasses import dataclass, field, replace
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import quantize

from edged.quant.types import row_bytes
from tests.helpers.harmony_template import HARMONY_CHAT_TEMPLATE, HARMONY_TOKENS
from tests.helpers.qdata import random_qtensor

# gpt-oss's experts: MXFP4, as the released files
GPT_OSS_EXPERT_TYPE = T.MXFP4

ARCHS = ("gemma3", "gemma2", "llama", "qwen2", "qwen3", "qwen3moe", "phi3", "gpt-oss")


@dataclass
class TinySpec:
    """Shape and options of a tiny model."""

    arch: str
    n_layers: int = 2
    n_embd: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    n_ff: int = 256  # a multiple of 256 so ffn_down can be a K-quant
    vocab: int = 300
    context: int = 256
    eps: float = 1e-6
    rope_base: float = 10000.0
    sliding_window: int = 0
    rope_scaling: str = "none"  # "none" | "linear" (factor 2) | "yarn" (factor 4, 64 original positions)
    rope_freqs: bool = False  # write a Llama-3-style rope_freqs.weight tensor
    tied: bool = True  # no output.weight: logits through token_embd
    write_key_length: bool = False
    extra_kv: dict = field(default_factory=dict)
    added_tokens: tuple = ()  # BPE only: USER_DEFINED tokens (e.g. "<tool_call>") in the last padding slots
    attn_softcap: float | None = None  # <arch>.attn_logit_softcapping, written when set (gemma2)
    final_softcap: float | None = None  # <arch>.final_logit_softcapping
    matrix_type: object = None  # a GGMLQuantizationType: every layer matrix in it (type coverage, fidelity)
    logit_gain: float = 1.0  # scales output_norm: peaked next-token distributions like real models'
    n_expert: int = 0  # mixture of experts: experts per layer (0: a dense FFN)
    n_expert_used: int = 0  # experts per token
    n_ff_exp: int = 0  # rows of each expert's gate/up (a multiple of 256 so ffn_down_exps can be a K-quant)
    expert_type: object = None  # every expert stack in this type (default: gate/up Q8_0, down Q4_K / Q8_0)


def default_spec(arch: str, **overrides) -> TinySpec:
    """The tiny geometry used for `arch` (real-model quirks included, e.g. head_dim ≠ n_embd/heads)."""
    base = {
        "gemma3": dict(n_layers=6, head_dim=32, write_key_length=True, sliding_window=4,
                       rope_base=1000000.0),
        # caps low enough that the tiny random logits reach them (real files: 50 and 30)
        "gemma2": dict(n_layers=4, head_dim=32, write_key_length=True, sliding_window=4,
                       attn_softcap=0.5, final_softcap=1.0),
        "llama": dict(eps=1e-5, tied=False),
        "qwen2": dict(rope_base=1000000.0),
        "qwen3": dict(head_dim=32, write_key_length=True, rope_base=1000000.0, tied=False),
        # n_ff (metadata only for MoE) differs from n_ff_exp, so a mix-up of the two cannot pass
        "qwen3moe": dict(head_dim=32, write_key_length=True, rope_base=1000000.0, tied=False, n_ff=768,
                         n_expert=8, n_expert_used=2, n_ff_exp=256),
        "phi3": dict(n_kv_heads=4, eps=1e-5, tied=False),
        # gpt-oss-20b's shape in small: head_dim != n_embd / n_heads, a window on the even layers,
        # YaRN, every layer a MoE with biases (experts in GPT_OSS_EXPERT_TYPE), output not tied
        "gpt-oss": dict(head_dim=32, write_key_length=True, rope_base=150000.0, eps=1e-5, tied=False,
                        sliding_window=4, rope_scaling="yarn", n_expert=8, n_expert_used=4, n_ff_exp=64),
    }[arch]
    return replace(TinySpec(arch=arch, **base), **overrides)


# ---------------------------------------------------------------------------------------------
# weights

def _quantized(rng, qtype, rows: int, cols: int, name: str):
    """(bytes [rows, row_bytes] or float array, raw_dtype) for GGUFWriter.add_tensor."""
    if qtype == T.F32:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32), None
    if qtype == T.F16:
        return (rng.standard_normal((rows, cols)) * 0.05).astype(np.float16), None
    if qtype in (T.Q8_0, T.Q5_0, T.Q4_0):  # gguf-py can quantize these from floats
        f = (rng.standard_normal((rows, cols)) * 0.05).astype(np.float32)
        return quantize(f, qtype), qtype
    qt = random_qtensor(qtype, rows, cols, seed=int(rng.integers(1 << 30)), name=name)
    return qt.data.reshape(rows, -1), qtype  # K-quants: random valid blocks


def _norm(rng, n: int) -> np.ndarray:
    return rng.uniform(0.7, 1.3, n).astype(np.float32)  # as stored: Gemma's `1 +` already folded


def model_tensors(spec: TinySpec, seed: int = 0) -> dict:
    """name -> (array, raw_dtype or None) for every tensor of the tiny model."""
    rng = np.random.default_rng(seed)
    a, e, hd, nh, nkv, ff = spec.arch, spec.n_embd, spec.head_dim, spec.n_heads, spec.n_kv_heads, spec.n_ff
    t = {}
    t["token_embd.weight"] = _quantized(rng, T.Q8_0, spec.vocab, e, "token_embd.weight")
    t["output_norm.weight"] = (_norm(rng, e) * np.float32(spec.logit_gain), None)
    if not spec.tied:
        t["output.weight"] = _quantized(rng, T.F16 if a == "llama" else T.Q8_0, spec.vocab, e, "output.weight")
    if spec.rope_freqs:
        t["rope_freqs.weight"] = (rng.uniform(1.0, 8.0, hd // 2).astype(np.float32), None)
    down_types = (T.Q6_K, T.Q4_K)
    for i in range(spec.n_layers):
        p = f"blk.{i}"

        def w(name, rows, cols, qtype):
            qt = qtype if spec.matrix_type is None else spec.matrix_type
            t[f"{p}.{name}"] = _quantized(rng, qt, rows, cols, f"{p}.{name}")

        t[f"{p}.attn_norm.weight"] = (_norm(rng, e), None)
        if a == "phi3":
            w("attn_qkv.weight", (nh + 2 * nkv) * hd, e, T.Q8_0)
        else:
            w("attn_q.weight", nh * hd, e, T.Q5_0)
            w("attn_k.weight", nkv * hd, e, T.Q4_0 if i % 2 else T.Q5_0)
            w("attn_v.weight", nkv * hd, e, T.Q8_0)
        w("attn_output.weight", e, nh * hd, T.F16 if i % 2 else T.Q8_0)
        if a in ("qwen2", "gpt-oss"):
            for n_, rows in (("q", nh * hd), ("k", nkv * hd), ("v", nkv * hd)):
                t[f"{p}.attn_{n_}.bias"] = ((rng.standard_normal(rows) * 0.1).astype(np.float32), None)
        if a == "gpt-oss":  # the output bias and one sink logit per head (large enough to take a share)
            t[f"{p}.attn_output.bias"] = ((rng.standard_normal(e) * 0.1).astype(np.float32), None)
            t[f"{p}.attn_sinks.weight"] = (rng.uniform(-1.0, 2.0, nh).astype(np.float32), None)
        if a in ("gemma3", "qwen3", "qwen3moe"):
            t[f"{p}.attn_q_norm.weight"] = (_norm(rng, hd), None)
            t[f"{p}.attn_k_norm.weight"] = (_norm(rng, hd), None)
        if a in ("gemma3", "gemma2"):
            t[f"{p}.post_attention_norm.weight"] = (_norm(rng, e), None)
            t[f"{p}.post_ffw_norm.weight"] = (_norm(rng, e), None)
        # gpt-oss names the FFN's input norm post_attention_norm
        t[f"{p}.{'post_attention_norm' if a == 'gpt-oss' else 'ffn_norm'}.weight"] = (_norm(rng, e), None)
        if spec.n_expert:  # router [n_expert, n_embd] (F32, as converters keep it) and stacked experts
            n_x, fe = spec.n_expert, spec.n_ff_exp
            t[f"{p}.ffn_gate_inp.weight"] = ((rng.standard_normal((n_x, e)) * 0.5).astype(np.float32), None)
            for name, rows, cols, qtype in (("ffn_gate_exps", fe, e, T.Q8_0), ("ffn_up_exps", fe, e, T.Q8_0),
                                            ("ffn_down_exps", e, fe, (T.Q4_K, T.Q8_0)[i % 2])):
                if a == "gpt-oss":
                    qtype = GPT_OSS_EXPERT_TYPE
                qtype = spec.expert_type or qtype
                arr, raw = _quantized(rng, qtype, n_x * rows, cols, f"{p}.{name}.weight")
                t[f"{p}.{name}.weight"] = (arr.reshape(n_x, rows, -1), raw)  # [n_expert, rows, row bytes]
                if a == "gpt-oss":  # a bias per expert: [n_expert, rows]
                    t[f"{p}.{name}.bias"] = ((rng.standard_normal((n_x, rows)) * 0.1).astype(np.float32), None)
            if a == "gpt-oss":
                t[f"{p}.ffn_gate_inp.bias"] = ((rng.standard_normal(n_x) * 0.5).astype(np.float32), None)
        elif a == "phi3":
            w("ffn_up.weight", 2 * ff, e, T.Q5_0)
        else:
            w("ffn_gate.weight", ff, e, T.Q5_0 if i % 2 else T.F16)
            w("ffn_up.weight", ff, e, T.Q4_0 if i % 2 else T.Q8_0)
        if not spec.n_expert:
            w("ffn_down.weight", e, ff, down_types[i % 2])
    return t


# ---------------------------------------------------------------------------------------------
# tokenizers

_SPM_PIECES = ["▁", *"abcdefghijklmnopqrstuvwxyz", "▁the", "▁of", "▁and", "▁to", "▁in", "▁is",
               "▁it", "▁a", "▁capital", "▁France", "▁Paris", "."]


# tokenizer.chat_template of the Gemma 2 instruct models (google/gemma-2-*-it tokenizer_config.json)
GEMMA2_CHAT_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
    "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
    "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"
)


def _spm_vocab(n: int, gemma: bool, turns: bool = False):
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"] if gemma else ["<unk>", "<s>", "</s>"]
    if turns:  # CONTROL tokens, as the converter marks them (ids 106, 107 in the real vocabulary)
        specials += ["<start_of_turn>", "<end_of_turn>"]
    tokens = list(specials)
    types = [3] * len(specials)  # CONTROL
    types[specials.index("<unk>")] = 2  # UNKNOWN
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    for i, piece in enumerate(_SPM_PIECES[: n - len(tokens)]):
        tokens.append(piece)
        types.append(1)
    while len(tokens) < n:
        tokens.append(f"▁w{len(tokens)}")
        types.append(1)
    scores = [0.0] * len(specials) + [0.0] * 256 + [-float(i) for i in range(n - len(specials) - 256)]
    ids = dict(bos=2, eos=1, unk=3, pad=0) if gemma else dict(bos=1, eos=2, unk=0)
    return tokens, scores, types, ids


def _bytes_to_unicode() -> list[str]:
    """GPT-2's printable stand-in character for each byte value."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def _bpe_vocab(n: int):
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tokens = _bytes_to_unicode()
    merges = []
    words = ["Ġthe", "Ġof", "Ġand", "Ġto", "Ġin", "Ġis", "Ġcapital", "ĠFrance", "ĠParis", "Ġa", "he", "in"]
    for word in words:  # left-to-right merge chain: "Ġ t" -> "Ġt", "Ġt h" -> "Ġth", ...
        cur = word[0]
        for ch in word[1:]:
            if len(tokens) >= n - len(specials):
                break
            merged = cur + ch
            if merged not in tokens:
                tokens.append(merged)
                merges.append(f"{cur} {ch}")
            cur = merged
    tokens = tokens[: n - len(specials)]
    while len(tokens) < n - len(specials):  # pad with unreachable pieces
        tokens.append(f"<unused{len(tokens)}>")
    types = [1] * len(tokens) + [3] * len(specials)
    ids = dict(bos=n - 3, eos=n - 1, pad=n - 3)
    return tokens + specials, types, merges, ids


def _write_tokenizer(wr: gguf.GGUFWriter, spec: TinySpec) -> None:
    if spec.arch in ("qwen2", "qwen3", "qwen3moe", "gpt-oss"):
        tokens, types, merges, ids = _bpe_vocab(spec.vocab)
        harmony = HARMONY_TOKENS if spec.arch == "gpt-oss" else ()
        first = spec.vocab - 3 - len(spec.added_tokens) - len(harmony)  # the three specials come last
        assert all(t.startswith("<unused") for t in tokens[first : spec.vocab - 3]), "vocab too small"
        for i, t in enumerate(spec.added_tokens):
            tokens[first + i], types[first + i] = t, 4  # USER_DEFINED, as Qwen 2.5's <tool_call>
        for i, t in enumerate(harmony, first + len(spec.added_tokens)):
            tokens[i], types[i] = t, 3  # CONTROL, as in converted gpt-oss files
        if harmony:  # gpt-oss's eos is <|return|>; its template is harmony's
            ids["eos"] = tokens.index("<|return|>")
            wr.add_chat_template(HARMONY_CHAT_TEMPLATE)
        wr.add_tokenizer_model("gpt2")
        wr.add_tokenizer_pre("qwen2")
        wr.add_token_list(tokens)
        wr.add_token_types(types)
        wr.add_token_merges(merges)
        wr.add_add_bos_token(False)
    else:
        tokens, scores, types, ids = _spm_vocab(spec.vocab, gemma=spec.arch in ("gemma3", "gemma2"),
                                                turns=spec.arch == "gemma2")
        wr.add_tokenizer_model("llama")
        wr.add_tokenizer_pre("default")
        if spec.arch == "gemma2":  # what convert_hf_to_gguf writes for Gemma 2
            wr.add_add_space_prefix(False)
            wr.add_chat_template(GEMMA2_CHAT_TEMPLATE)
        wr.add_token_list(tokens)
        wr.add_token_scores(scores)
        wr.add_token_types(types)
        wr.add_add_bos_token(True)
        wr.add_unk_token_id(ids["unk"])
    wr.add_bos_token_id(ids["bos"])
    wr.add_eos_token_id(ids["eos"])
    if "pad" in ids:
        wr.add_pad_token_id(ids["pad"])
    wr.add_add_eos_token(False)


# ---------------------------------------------------------------------------------------------

def write_tiny_model(path, arch: str, *, seed: int = 0, omit: tuple = (), reshape: dict | None = None,
                     arch_name: str | None = None, **overrides) -> Path:
    """Write a tiny random `arch` model to `path`; returns the path.

    overrides: TinySpec fields (n_layers, sliding_window, rope_scaling, rope_freqs, tied, ...).
    omit: tensor names to leave out; reshape: name -> new numpy shape (same element count) — for
    error tests. arch_name: value written as general.architecture (default `arch`).
    """
    spec = default_spec(arch, **overrides)
    tensors = model_tensors(spec, seed)
    path = Path(path)
    name = arch_name or arch
    wr = gguf.GGUFWriter(str(path), name)
    wr.add_name(f"tiny-{arch}")
    wr.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    wr.add_context_length(spec.context)
    wr.add_embedding_length(spec.n_embd)
    wr.add_block_count(spec.n_layers)
    wr.add_feed_forward_length(spec.n_ff)
    wr.add_head_count(spec.n_heads)
    wr.add_head_count_kv(spec.n_kv_heads)
    wr.add_layer_norm_rms_eps(spec.eps)
    wr.add_rope_freq_base(spec.rope_base)
    if spec.write_key_length:
        wr.add_key_length(spec.head_dim)
        wr.add_value_length(spec.head_dim)
    if arch in ("llama", "phi3"):
        wr.add_rope_dimension_count(spec.head_dim)
    if arch == "llama":
        wr.add_vocab_size(spec.vocab)
    if spec.sliding_window:
        wr.add_sliding_window(spec.sliding_window)
    if spec.n_expert:
        wr.add_expert_count(spec.n_expert)
        wr.add_expert_used_count(spec.n_expert_used)
        wr.add_expert_feed_forward_length(spec.n_ff_exp)
    if spec.rope_scaling == "linear":
        wr.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        wr.add_rope_scaling_factor(2.0)
    if spec.rope_scaling == "yarn":  # factor 4 over 64 original positions: the ramp spans the head's pairs
        wr.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        wr.add_rope_scaling_factor(4.0)
        wr.add_rope_scaling_orig_ctx_len(64)
    if spec.attn_softcap is not None:
        wr.add_attn_logit_softcapping(spec.attn_softcap)
    if spec.final_softcap is not None:
        wr.add_final_logit_softcapping(spec.final_softcap)
    _write_tokenizer(wr, spec)
    for k, v in spec.extra_kv.items():  # last: they may replace any key written above
        wr.add_key_value(k, v[0], v[1])
    for tname, (arr, raw_dtype) in tensors.items():
        if tname in omit:
            continue
        if reshape and tname in reshape:
            rows, cols = (1, *reshape[tname])[-2:]
            # quantized tensors are byte arrays [rows, row_bytes]: reshape the bytes
            arr = arr.reshape(reshape[tname]) if raw_dtype is None else arr.reshape(rows, row_bytes(raw_dtype, cols))
        if raw_dtype is None:
            wr.add_tensor(tname, arr)
        else:
            wr.add_tensor(tname, arr, raw_dtype=raw_dtype)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path
