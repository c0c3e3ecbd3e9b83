"""Byte-level BPE on a tiny but real vocabulary written with gguf.GGUFWriter.

Vocabulary: ids 0..255 are the single bytes (as GPT-2 byte characters: space is "Ġ", newline "Ċ",
"é" is the two bytes "Ã©"), then one token per merge (id 256 + rank), then "xyz" and three control
tokens. Expected ids are derived in the comments: the pre-tokenizer's words first, then merges by
rank (lowest first; ties leftmost) inside each word.
"""

import pytest

from edged.tokenizer import Tokenizer, TokenizerError
from tests.tokenizer.vocab_files import CONTROL, NORMAL, byte_level_alphabet, write_vocab

MERGES = [
    "Ġ t", "h e", "Ġt he", "' s", "' t", "' r", "'r e", "' v", "'v e", "' m",  # 0-9
    "' l", "'l l", "' d", "1 2", "12 3", "4 5", "Ġ Ġ", "Ċ Ċ", "i t", "Ġ c",  # 10-19
    "Ġc a", "Ġca t", "c a", "ca t", "Ã ©", "Ġ Ã©", "t h",  # 20-26
]
EXTRA = ["xyz", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
ALPHABET = byte_level_alphabet()
TOKENS = ALPHABET + [m.replace(" ", "") for m in MERGES] + EXTRA
ID = {t: i for i, t in enumerate(TOKENS)}
BOS, EOS, EOT = ID["<|begin_of_text|>"], ID["<|end_of_text|>"], ID["<|eot_id|>"]


def b(ch: str) -> int:
    """Id of a single-byte token given the raw character (ASCII)."""
    return ord(ch)


def m(text: str) -> int:
    """Id of a merged token given its byte-level text."""
    return ID[text]


@pytest.fixture(scope="module")
def make(tmp_path_factory):
    made = {}

    def _make(pre: str):
        if pre not in made:
            types = [NORMAL] * (len(TOKENS) - 3) + [CONTROL] * 3
            gf = write_vocab(
                tmp_path_factory.mktemp("bpe") / f"{pre}.gguf", "gpt2", TOKENS, types=types, merges=MERGES, pre=pre,
                ints={"bos_token_id": BOS, "eos_token_id": EOS},
            )
            made[pre] = Tokenizer.from_gguf(gf)
        return made[pre]

    return _make


# (text, expected ids) for tokenizer.ggml.pre = "llama-bpe" (llama3 regex, ignore_merges)
LLAMA3_CASES = [
    # words "it" "'s": i+t (rank 18); '+s (rank 3)
    ("it's", [m("it"), m("'s")]),
    # contractions are case-insensitive in llama3: "'S" is one word, but has no merge
    ("it'S", [m("it"), b("'"), b("S")]),
    # "they" "'re": h+e (1) beats t+h (26), and "t he" is no merge; ' r (5) then 'r e (6)
    ("they're", [b("t"), m("he"), b("y"), m("'re")]),
    # each contraction is a word; " we" " he" " I" " don" keep their space (Ġ = 32)
    ("I've we'll he'd I'm don't",
     [b("I"), m("'ve"), 32, b("w"), b("e"), m("'ll"), 32, m("he"), m("'d"), 32, b("I"), m("'m"),
      32, b("d"), b("o"), b("n"), m("'t")]),
    # digits in groups of at most three: "451" "2"; inside "451" only 4+5 merges
    ("4512", [m("45"), b("1"), b("2")]),
    ("12345", [m("123"), m("45")]),
    # whitespace run before a word: "\s+(?!\S)" takes two spaces, the third joins " b"
    ("a   b", [b("a"), m("ĠĠ"), 32, b("b")]),
    # trailing whitespace at the end is one word
    ("a  ", [b("a"), m("ĠĠ")]),
    # newlines: "\s*[\r\n]+" takes "\n\n", the space joins "b"
    ("a\n\n b", [b("a"), m("ĊĊ"), 32, b("b")]),
    # punctuation keeps its trailing newlines: "!!\n\n"
    ("a!!\n\nb", [b("a"), b("!"), b("!"), m("ĊĊ"), b("b")]),
    # unicode letters: " café" is one word; Ġ+c (19), Ġc+a (20); "Ġca f" no merge; Ã+© (24)
    (" café", [m("Ġca"), b("f"), m("Ã©")]),
    # "the": h e (1) beats t h (26), leaving t+he; " cat": Ġ c (19), Ġc a (20), Ġca t (21)
    ("the cat", [b("t"), m("he"), m("Ġcat")]),
    # a word that is itself a token is taken whole (ignore_merges), though no merge builds it
    ("xyz", [ID["xyz"]]),
    # a non-ASCII digit is \p{N}: three-digit groups apply to Arabic-Indic digits too
    ("\u0661\u0662\u0663\u0664", [0xD9, 0xA1, 0xD9, 0xA2, 0xD9, 0xA3, 0xD9, 0xA4]),
]


@pytest.mark.parametrize("text,expected", LLAMA3_CASES, ids=[repr(c[0]) for c in LLAMA3_CASES])
def test_llama3(make, text, expected):
    tok = make("llama-bpe")
    # byte ids of non-ASCII bytes are the byte value: the alphabet is in byte order
    assert tok.encode(text, add_special=False) == expected
    assert tok.encode(text) == [BOS] + expected  # llama3 adds BOS
    assert tok.decode(tok.encode(text)) == text


def test_llama3_words_split_digits_and_non_ascii(make):
    tok = make("llama-bpe")
    words = tok._pre.split("\u0661\u0662\u0663\u0664 x1234y")
    assert words == ["\u0661\u0662\u0663", "\u0664", " x", "123", "4", "y"]


GPT2_CASES = [
    # gpt-2 digits are not grouped: "4512" is one word; 1+2 (13) before 4+5 (15)
    ("4512", [m("45"), m("12")]),
    # " 12345" is one word with its space
    (" 12345", [32, m("123"), m("45")]),
    # contractions are case-sensitive: "'S" splits into "'" and "S"
    ("it'S", [m("it"), b("'"), b("S")]),
    ("cat's", [m("cat"), m("'s")]),
    # no ignore_merges: "xyz" is built from merges only, and there are none
    ("xyz", [b("x"), b("y"), b("z")]),
    # a lone whitespace before a letter is its own word
    ("a\tb", [b("a"), 9, b("b")]),
    ("a   b", [b("a"), m("ĠĠ"), 32, b("b")]),
]


@pytest.mark.parametrize("text,expected", GPT2_CASES, ids=[repr(c[0]) for c in GPT2_CASES])
def test_gpt2(make, text, expected):
    tok = make("gpt-2")
    assert tok.encode(text) == expected  # gpt-2 adds no BOS
    assert tok.decode(expected) == text


def test_qwen2_splits_every_digit(make):
    tok = make("qwen2")
    assert tok.encode("12345") == [b("1"), b("2"), b("3"), b("4"), b("5")]
    assert tok.encode("it's") == [m("it"), m("'s")]


def test_special_tokens_and_eog(make):
    tok = make("llama-bpe")
    assert tok.encode("hi<|eot_id|>it") == [BOS, b("h"), b("i"), EOT, m("it")]
    assert tok.encode("hi<|eot_id|>", parse_special=False)[-3:] == [b("d"), b("|"), b(">")]
    assert tok.eos_ids[0] == EOS and set(tok.eos_ids) == {EOS, EOT}  # <|eot_id|> found by its text
    assert tok.decode([BOS, m("it"), EOT]) == "it"
    assert tok.decode([BOS, m("it"), EOT], skip_special=False) == "<|begin_of_text|>it<|eot_id|>"


@pytest.mark.parametrize("text", ["Emoji: 😀🎉👩\u200d👧 ❤️", "日本語のテキスト 한국어", "x\u00a0y\u3000z\r\n"])
def test_byte_level_round_trip_and_stream(make, text):
    tok = make("llama-bpe")
    ids = tok.encode(text, add_special=False)
    assert tok.decode(ids) == text
    dec = tok.stream_decoder()
    parts = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(parts) == text and "\ufffd" not in "".join(parts)


def test_unsupported_pre(tmp_path):
    gf = write_vocab(tmp_path / "x.gguf", "gpt2", TOKENS, merges=MERGES, pre="no-such-pre")
    with pytest.raises(TokenizerError, match="tokenizer.ggml.pre 'no-such-pre' is not supported"):
        Tokenizer.from_gguf(gf)
