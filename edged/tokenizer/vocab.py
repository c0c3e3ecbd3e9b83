"""Vocabulary from GGUF metadata: tokens, scores, token attributes, special ids and flags.

Mirrors what llama.cpp's `llama_vocab::impl::load` derives from the same keys (defaults per
tokenizer model, EOT/EOM/EOG detection by token text, "unused" control tokens), and validates
everything it reads: a malformed vocabulary raises TokenizerError naming the key.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field

import numpy as np

from edged.tokenizer.errors import TokenizerError

log = logging.getLogger("edged.tokenizer")

# llama.cpp's llama_token_attr bits.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

# GGUF tokenizer.ggml.token_type values -> attribute bits.
_TYPE_TO_ATTR = np.array(
    [ATTR_UNDEFINED, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE],
    dtype=np.int32,
)

SUPPORTED_MODELS = ("llama", "gpt2")

# Token texts llama.cpp treats as end-of-turn / end-of-message / end-of-generation (same lists).
# longest special (control / user-defined) token text: real vocabularies stay under 40 (Gemma 3: 31);
# the special-token matcher's trie regex recurses once per character (5000: a RecursionError)
MAX_SPECIAL_CHARS = 256
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_TEXTS = {
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
)

_BYTE_TOKEN_RE = re.compile(r"<0x[0-9A-Fa-f]{2}>\Z")

# BPE pre-tokenizer names llama.cpp accepts -> (pre type, flag overrides). Only the families
# edged.tokenizer.pretokenize implements are listed; others are rejected at load.
_BPE_PRE: dict[str, tuple[str, dict]] = {}


def _pre(names: tuple[str, ...], pre_type: str, **flags) -> None:
    for n in names:
        _BPE_PRE[n] = (pre_type, flags)


_pre(("default",), "default")
_pre(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
     "llama3", ignore_merges=True, add_bos=True)
_pre(("dbrx",), "llama3")
_pre(("smaug-bpe",), "llama3")
_pre(("glm4", "chatglm-bpe"), "llama3", bos_none=True)
_pre(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), "gpt-4o", clean_spaces=False)
_pre(("deepseek-llm",), "deepseek-llm", clean_spaces=False)
_pre(("deepseek-coder",), "deepseek-coder", clean_spaces=False)
_pre(("falcon",), "falcon")
_pre(("mpt", "olmo", "jais", "exaone4"), "gpt2")
_pre(("gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0", "mellum", "modern-bert"),
     "gpt2")
_pre(("trillion", "granite-docling"), "gpt2", clean_spaces=False)
_pre(("jina-v1-en", "jina-v2-code", "roberta-bpe"), "gpt2", add_sep=True)
_pre(("starcoder", "refact", "codeshell", "exaone", "minerva-7b", "mellum2"), "starcoder")
_pre(("command-r", "smollm"), "starcoder", clean_spaces=False)
_pre(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "hunyuan", "solar-open"), "qwen2", clean_spaces=False)
_pre(("stablelm2", "megrez"), "qwen2")
_pre(("poro-chat",), "bloom", clean_spaces=False)
_pre(("bloom", "gpt3-finnish"), "bloom")


def _opt_id(gf, key: str, default: int | None, n_tokens: int, strict: bool = True) -> int | None:
    """A special-token id key. Out-of-vocabulary values are an error when `strict` (ids edged
    encodes or stops on); otherwise, as llama.cpp does, a warning and the default."""
    if default is not None and default >= n_tokens:
        default = None  # llama.cpp disables default ids that fall outside the vocabulary
    if key not in gf:
        return default
    v = gf.get_int(key)
    if not 0 <= v < n_tokens:
        if strict:
            raise TokenizerError(f"{key} = {v} is outside the vocabulary (0..{n_tokens - 1})")
        # e.g. a padding id equal to the vocabulary size, common in converted Llama 3 files
        log.warning("%s = %d is outside the vocabulary (0..%d); ignored", key, v, n_tokens - 1)
        return default
    return v


@dataclass
class Vocab:
    """A validated vocabulary (see module docstring). Arrays are indexed by token id."""

    model: str  # "llama" (SentencePiece BPE, llama.cpp's SPM) or "gpt2" (byte-level BPE)
    pre: str  # BPE pre-tokenizer family ("" for SPM)
    tokens: list[str]
    scores: np.ndarray  # [n_vocab] float32
    attrs: np.ndarray  # [n_vocab] int32, ATTR_* bits
    token_to_id: dict[str, int]
    merges: list[tuple[str, str]] = field(default_factory=list)  # BPE, rank = index
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    eom_id: int | None = None
    unk_id: int | None = None
    sep_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False
    add_space_prefix: bool = False
    clean_spaces: bool = False
    ignore_merges: bool = False
    eog_ids: tuple[int, ...] = ()  # eos first, then the rest ascending
    special_ids: tuple[int, ...] = ()  # control/user-defined/unknown, longest text first

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @classmethod
    def from_gguf(cls, gf) -> "Vocab":
        """Reads and validates the tokenizer.ggml.* keys of a GGUFFile (typed accessors only)."""
        model = gf.get_str("tokenizer.ggml.model", None)
        if model is None:
            raise TokenizerError("tokenizer.ggml.model is missing: the file has no tokenizer")
        if model not in SUPPORTED_MODELS:
            raise TokenizerError(f"tokenizer.ggml.model '{model}' is not supported (supported: {', '.join(SUPPORTED_MODELS)})")
        tokens = gf.get_str_list("tokenizer.ggml.tokens", None)
        if tokens is None:
            raise TokenizerError("tokenizer.ggml.tokens is missing")
        n = len(tokens)
        if n == 0:
            raise TokenizerError("tokenizer.ggml.tokens is empty")
        scores = gf.get_array("tokenizer.ggml.scores", None)
        types = gf.get_array("tokenizer.ggml.token_type", None)
        merges = gf.get_str_list("tokenizer.ggml.merges", None) if model == "gpt2" else None
        if model == "gpt2" and merges is None:
            raise TokenizerError("tokenizer.ggml.merges is missing (required by a gpt2 BPE tokenizer)")

        v = _build(model, tokens, scores, types, merges)
        v.pre = gf.get_str("tokenizer.ggml.pre", "") if model == "gpt2" else ""
        _apply_model_defaults(v, gf)
        return v

    def validate_special_ids(self) -> None:
        """add_bos/add_eos need the matching id (llama.cpp: check_add_special_token)."""
        if self.add_bos and self.bos_id is None:
            raise TokenizerError("tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set")
        if self.add_eos and self.eos_id is None:
            raise TokenizerError("tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set")
        if self.add_sep and self.sep_id is None:
            raise TokenizerError("tokenizer.ggml.add_sep_token is true, but tokenizer.ggml.seperator_token_id is not set")


def _build(model: str, tokens: list[str], scores, types, merges) -> Vocab:
    """Token table, attributes and merges, with the structural checks."""
    n = len(tokens)
    if scores is not None:
        if scores.ndim != 1 or len(scores) != n:
            raise TokenizerError(f"tokenizer.ggml.scores has {len(scores)} entries, tokenizer.ggml.tokens {n}")
        if scores.dtype.kind not in "fiu":
            raise TokenizerError(f"tokenizer.ggml.scores has element type {scores.dtype}, expected FLOAT32 or INT32")
        scores = np.ascontiguousarray(scores, dtype=np.float32)
    else:
        scores = np.zeros(n, dtype=np.float32)
    if types is not None:
        if types.ndim != 1 or len(types) != n:
            raise TokenizerError(f"tokenizer.ggml.token_type has {len(types)} entries, tokenizer.ggml.tokens {n}")
        if types.dtype.kind not in "iu":
            raise TokenizerError(f"tokenizer.ggml.token_type has element type {types.dtype}, expected INT32")
        types = np.asarray(types, dtype=np.int64)
        bad = np.flatnonzero((types < 0) | (types >= len(_TYPE_TO_ATTR)))
        if len(bad):
            i = int(bad[0])
            raise TokenizerError(f"tokenizer.ggml.token_type[{i}] = {int(types[i])} is not a token type (0..6)")
        attrs = _TYPE_TO_ATTR[types]
    else:
        attrs = np.full(n, ATTR_NORMAL, dtype=np.int32)

    token_to_id = dict(zip(tokens, range(n)))
    if "" in token_to_id:
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]  # llama.cpp's name for an empty token
        token_to_id = dict(zip(tokens, range(n)))
    else:
        tokens = list(tokens)
    if len(token_to_id) != n:
        seen: dict[str, int] = {}
        for i, t in enumerate(tokens):
            if t in seen:
                raise TokenizerError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
            seen[t] = i

    for i in np.flatnonzero(attrs & ATTR_BYTE):
        if not _BYTE_TOKEN_RE.match(tokens[i]):
            raise TokenizerError(f"token {int(i)} {tokens[i]!r} has type BYTE but is not of the form <0xXX>")

    pairs: list[tuple[str, str]] = []
    if merges is not None:
        for rank, m in enumerate(merges):
            pos = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
            if pos < 0:
                raise TokenizerError(f"tokenizer.ggml.merges[{rank}] {m!r} is not two tokens separated by a space")
            a, b = m[:pos], m[pos + 1 :]
            if a not in token_to_id or b not in token_to_id or a + b not in token_to_id:
                missing = next(x for x in (a, b, a + b) if x not in token_to_id)
                raise TokenizerError(f"tokenizer.ggml.merges[{rank}] {m!r} refers to {missing!r}, which is not a token")
            pairs.append((a, b))
    return Vocab(model=model, pre="", tokens=tokens, scores=scores, attrs=attrs, token_to_id=token_to_id, merges=pairs)


def _apply_model_defaults(v: Vocab, gf) -> None:
    """Flags and special ids: llama.cpp's per-model defaults, then the file's keys."""
    n = v.n_tokens
    if v.model == "llama":
        bos, eos, unk = 1, 2, 0
        v.add_space_prefix, v.add_bos, v.add_eos, v.clean_spaces = True, True, False, False
    else:
        bos, eos, unk = 11, 11, None
        v.add_space_prefix, v.add_bos, v.add_eos, v.clean_spaces = False, False, False, True
        pre = v.pre or "default"  # llama.cpp warns and uses 'default' when the key is absent
        if pre not in _BPE_PRE:
            raise TokenizerError(
                f"tokenizer.ggml.pre '{v.pre}' is not supported (supported: {', '.join(sorted(_BPE_PRE))})"
            )
        v.pre, flags = _BPE_PRE[pre]
        v.ignore_merges = flags.get("ignore_merges", False)
        v.add_bos = flags.get("add_bos", False)
        v.add_sep = flags.get("add_sep", False)
        v.clean_spaces = flags.get("clean_spaces", True)
        if flags.get("bos_none"):
            bos = None
    v.add_space_prefix = gf.get_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix)

    k = "tokenizer.ggml."
    v.bos_id = _opt_id(gf, k + "bos_token_id", bos, n)
    v.eos_id = _opt_id(gf, k + "eos_token_id", eos, n)
    v.eot_id = _opt_id(gf, k + "eot_token_id", None, n)
    v.eom_id = _opt_id(gf, k + "eom_token_id", None, n)
    v.unk_id = _opt_id(gf, k + "unknown_token_id", unk, n)
    v.sep_id = _opt_id(gf, k + "seperator_token_id", None, n)
    v.pad_id = _opt_id(gf, k + "padding_token_id", None, n, strict=False)
    fim = {name: _opt_id(gf, k + name + "_token_id", None, n, strict=False) for name in _FIM_TEXTS}
    for old, name in (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid")):
        fim[name] = _opt_id(gf, k + old + "_token_id", fim[name], n, strict=False)  # deprecated key names

    v.add_bos = gf.get_bool(k + "add_bos_token", v.add_bos)
    v.add_eos = gf.get_bool(k + "add_eos_token", v.add_eos)
    v.add_sep = gf.get_bool(k + "add_sep_token", v.add_sep)
    v.validate_special_ids()
    _detect_special(v, fim)


def _first_present(v: Vocab, texts: tuple[str, ...]) -> int | None:
    for t in texts:
        if t in v.token_to_id:
            return v.token_to_id[t]
    return None


def _mark_control(v: Vocab, tid: int) -> None:
    # llama.cpp: "control-looking token ... was not control-type ... its type will be overridden"
    v.attrs[tid] |= ATTR_CONTROL


def _detect_special(v: Vocab, fim: dict[str, int | None]) -> None:
    """EOT/EOM by text, unused control tokens, the EOG set and the special-token order."""
    if v.eot_id is None:
        v.eot_id = _first_present(v, _EOT_TEXTS)
        if v.eot_id is not None:
            _mark_control(v, v.eot_id)
    if v.eom_id is None:
        v.eom_id = _first_present(v, _EOM_TEXTS)
        if v.eom_id is not None:
            _mark_control(v, v.eom_id)
    for name, texts in _FIM_TEXTS.items():
        if fim[name] is None:
            fim[name] = _first_present(v, texts)
            if fim[name] is not None:
                _mark_control(v, fim[name])

    for i in np.flatnonzero(v.attrs & ATTR_CONTROL):
        if "unused" in v.tokens[i]:
            v.attrs[i] |= ATTR_UNUSED

    eog = {fim[x] for x in ("fim_pad", "fim_rep", "fim_sep") if fim[x] is not None}
    for t in _EOG_TEXTS:
        tid = v.token_to_id.get(t)
        if tid is not None:
            eog.add(tid)
            _mark_control(v, tid)
    # gpt-oss: these always render, as user-defined tokens
    for t in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
        if t in v.token_to_id:
            v.attrs[v.token_to_id[t]] = ATTR_USER_DEFINED
    eog |= {x for x in (v.eos_id, v.eot_id, v.eom_id) if x is not None}

    texts = {v.tokens[i]: i for i in eog}
    # o200k_harmony / solar-open: <|end|> is not end-of-generation when <|return|>/<|call|> exist
    if "<|end|>" in texts and (
        ("<|return|>" in texts and ("<|call|>" in texts or "<|calls|>" in texts))
        or (("<|call|>" in texts or "<|calls|>" in texts) and "<|flush|>" in texts)
    ):
        eog.discard(texts["<|end|>"])
        v.attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    # gemma4 / paddleocr: </s> is an ordinary token when <|tool_response> exists
    if "<|tool_response>" in texts and "</s>" in texts:
        eog.discard(texts["</s>"])
        v.attrs[texts["</s>"]] = ATTR_NORMAL

    first = [v.eos_id] if v.eos_id in eog else []
    v.eog_ids = tuple(first + sorted(eog - set(first)))

    special = np.flatnonzero(v.attrs & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN))
    # llama.cpp sorts by text length, longest first (std::sort; ties here by id)
    v.special_ids = tuple(sorted((int(i) for i in special), key=lambda i: (-len(v.tokens[i]), i)))
    if v.special_ids and len(v.tokens[v.special_ids[0]]) > MAX_SPECIAL_CHARS:  # found by fuzzing
        i = v.special_ids[0]
        raise TokenizerError(f"tokenizer.ggml.tokens[{i}] is a special token of {len(v.tokens[i])} "
                             f"characters; at most {MAX_SPECIAL_CHARS} are supported")
