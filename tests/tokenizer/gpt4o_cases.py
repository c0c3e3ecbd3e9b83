"""The gpt-4o (o200k) pre-tokenizer check shared by its test and its llama.cpp recorder: hard strings and
a tiny byte-level BPE vocabulary whose merges were learned across word boundaries, so any difference in
where the pre-tokenizer splits shows up as different token ids.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path

from edged.tokenizer.bpe import byte_encode
from tests.helpers.model import FIXTURES
from tests.tokenizer.vocab_files import CONTROL, NORMAL, byte_level_alphabet, write_vocab

FIXTURE = FIXTURES / "gpt4o_llamacpp_tokens.json"
# tokenizer.ggml.pre names llama.cpp gives the gpt-4o regex list (LLAMA_VOCAB_PRE_TYPE_GPT4O and MINIMAX_M2)
PRE_NAMES = ("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2")
N_MERGES = 2000  # more than the texts need: merging stops when every text is one token
SPECIAL = "<|endoftext|>"

TEXTS = (
    # contractions in both cases, after lower, upper and mixed-case words
    "DON'T", "don't", "I'm", "I'M", "YOU'RE you're", "they'll THEY'LL", "We'VE", "it'S", "I'D i'd",
    "JOHN'S john's", "'s 'S ''", "a's'b", "rock'n'roll",
    # case runs: the o200k regex splits before an upper run and keeps lower letters after it
    "HeLLo", "CamelCaseWord", "XMLHttpRequest", "iPhone eBay", "ABCdef abcDEF", "getHTTPResponseCode", "A",
    # digit runs of 1 to 7 and digits inside words
    "1", "12", "123", "1234", "12345", "123456", "1234567", "3.14159", "x2y v1.2.3", "\u0663\u0664\u0665 \u2460\u2461",
    # paths, punctuation with slashes and newlines, escapes left alone
    "path/to/file\n", "a//b\n\n", "http://x.y/z?q=1&r=2", "C:\\Users\\me", "!!!", "...\n", "(a) [b] {c}",
    "x=1+2*3;", "foo_bar-baz", "$100 C++", "--flag=value\n",
    # non-ASCII letters with case: collapsed, every one counts as upper and as lower
    "\u00dcn\u00efc\u00f6d\u00e9 \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3", "na\u00cfve", "\u00c9COLE\u00e9cole",
    "stra\u00dfe \u00dcBER", "\u01c5emal", "\u03a9mega", "caf\u00e9 \u00e9t\u00e9",
    # combining marks (not letters in llama.cpp's rewrite), Devanagari, Arabic
    "cafe\u0301 nai\u0308ve", "e\u0301x", "\u0928\u092e\u0938\u094d\u0924\u0947", "\u0645\u0631\u062d\u0628\u0627",
    # CJK, Hangul
    "\u4f60\u597d\u4e16\u754c", "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8", "\ud55c\uad6d\uc5b4 text",
    # emoji: skin tone, variation selector, ZWJ sequence
    "\U0001f44d\U0001f3fd \U0001f389\U0001f389", "\u2764\ufe0f ok", "\U0001f468\u200d\U0001f469\u200d\U0001f467",
    # whitespace: runs, tabs, CRLF, trailing, non-ASCII spaces
    "a   b", "   ", "a \t b", "\t\tx", "x  \n  y", "trailing   ", "\r\n", "line1\r\nline2\r\n\r\n",
    "a\u00a0b \u3000c", " \n", "\n\n\n", "tab\tsep\tvalues",
    # a longer mixed line
    "The quick BROWN fox's 2024 jump\u2014over 12 lazy DOGS! \U0001f600\n",
)


def _learn_merges(texts, n: int) -> list[tuple[str, str]]:
    """BPE merges learned on the raw byte-level texts (no pre-tokenization): most frequent adjacent pair
    first, ties by the larger pair, so merged tokens span the places a pre-tokenizer may split."""
    seqs = [list(byte_encode(t)) for t in texts]
    merges = []
    for _ in range(n):
        counts = Counter(p for s in seqs for p in zip(s, s[1:]))
        if not counts:
            break
        a, b = max(counts, key=lambda p: (counts[p], p))
        merges.append((a, b))
        for s in seqs:
            i = 0
            while i < len(s) - 1:
                if s[i] == a and s[i + 1] == b:
                    s[i : i + 2] = [a + b]
                i += 1
    return merges


def vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): 256 bytes, one token per merge, then <|endoftext|>."""
    merges = _learn_merges(TEXTS, N_MERGES)
    tokens = byte_level_alphabet() + [a + b for a, b in merges] + [SPECIAL]
    types = [NORMAL] * (len(tokens) - 1) + [CONTROL]
    return tokens, types, [f"{a} {b}" for a, b in merges]


def vocab_sha256() -> str:
    """Fingerprint of the vocabulary, kept in the fixture so a changed vocabulary asks for a re-record."""
    tokens, types, merges = vocabulary()
    return hashlib.sha256(repr((tokens, types, merges)).encode()).hexdigest()


def write_gguf(path: Path, pre: str):
    """A tensor-less GGUF with the vocabulary and tokenizer.ggml.pre = `pre`, opened with load_gguf."""
    tokens, types, merges = vocabulary()
    eot = len(tokens) - 1
    return write_vocab(path, "gpt2", tokens, types=types, merges=merges, pre=pre,
                       ints={"bos_token_id": eot, "eos_token_id": eot}, bools={"add_bos_token": False})
