"""The gpt-4o (o200k) pre-tokenizer, token-exact to llama.cpp: ids recorded with its llama-tokenize
(tests/tokenizer/record_gpt4o_llamacpp.py) for every tokenizer.ggml.pre name it maps to that regex."""

import json

import pytest

from edged.tokenizer import Tokenizer
from edged.tokenizer.pretokenize import _CONTRACTIONS, REGEXES, PreTokenizer
from tests.tokenizer.gpt4o_cases import FIXTURE, PRE_NAMES, TEXTS, vocab_sha256, write_gguf


@pytest.fixture(scope="module")
def recorded():
    data = json.loads(FIXTURE.read_text())
    # the fixture belongs to this vocabulary and these texts; re-record after changing either
    assert data["vocab_sha256"] == vocab_sha256()
    assert data["texts"] == list(TEXTS)
    assert sorted(data["ids"]) == sorted(PRE_NAMES)
    return data


def _encode_all(path, pre):
    tok = Tokenizer.from_gguf(write_gguf(path, pre))
    return [tok.encode(t, add_special=False, parse_special=False) for t in TEXTS]


@pytest.mark.parametrize("pre", PRE_NAMES)
def test_ids_equal_llamacpp(tmp_path, recorded, pre):
    got = _encode_all(tmp_path / f"{pre}.gguf", pre)
    for text, mine, theirs in zip(TEXTS, got, recorded["ids"][pre]):
        assert mine == theirs, repr(text)


# tokenizer.json's o200k regex; collapsed as llama.cpp collapses, \p{Lu} and \p{Ll} both become "a letter"
_TOKENIZER_JSON = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + _CONTRACTIONS
                   + r"?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + _CONTRACTIONS
                   + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def test_fixture_tells_regexes_apart(tmp_path, recorded, monkeypatch):
    # the merges span word boundaries, so a split elsewhere gives other ids: the unrewritten regex
    # loses the ASCII case split and keeps marks with their letter; llama3's splits off contractions
    want = recorded["ids"]["gpt-4o"]
    llama3 = _encode_all(tmp_path / "llama3.gguf", "llama-bpe")
    assert {"don't", "JOHN'S john's"} <= {t for t, a, b in zip(TEXTS, llama3, want) if a != b}
    monkeypatch.setitem(REGEXES, "gpt-4o", (_TOKENIZER_JSON,))
    unrewritten = _encode_all(tmp_path / "json.gguf", "gpt-4o")
    assert {"HeLLo", "getHTTPResponseCode", "e\u0301x"} <= {t for t, a, b in zip(TEXTS, unrewritten, want) if a != b}


@pytest.mark.parametrize(
    "text,words",
    [
        # an upper run, then lower letters; a lone upper run keeps its contraction
        ("HeLLoWorld DON'T", ["He", "LLo", "World", " DON'T"]),
        # non-ASCII letters collapse to one class, both upper and lower: no split inside
        ("na\u00cfve \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3",
         ["na\u00cfve", " \u03a3\u038a\u03a3\u03a5\u03a6\u039f\u03a3"]),
        # a combining mark is not a letter: it leads the next word
        ("e\u0301x", ["e", "\u0301x"]),
        # digits by three; punctuation keeps following slashes and newlines
        ("1234567 a/b//\n", ["123", "456", "7", " a", "/b", "//\n"]),
    ],
)
def test_split(text, words):
    assert PreTokenizer("gpt-4o").split(text) == words
