"""Pre-tokenizer word splits per tokenizer.ggml.pre family (expected splits derived by hand from
llama.cpp's regex lists, applied one after another)."""

import pytest

from edged.tokenizer import TokenizerError
from edged.tokenizer.pretokenize import PreTokenizer, collapse


def test_collapse_classes():
    # letter, ASCII digit, Arabic-Indic digit, combining mark, symbol, NBSP, ZWSP (format: other)
    assert collapse("a\u00e91\u0661\u0301\u20ac\u00a0\u200b!") == "a\xd21\xd1\xd4\xd5\x0b\xd0!"


@pytest.mark.parametrize(
    "pre,text,words",
    [
        # llama3: contractions (any case), letters with one leading non-letter, digits by three,
        # punctuation with its newlines, newline runs, whitespace not before a word
        ("llama3", "I'M here's 1234567 x!!\n\n  \n y", ["I", "'M", " here", "'s", " ", "123", "456", "7", " x", "!!\n\n", "  \n", " y"]),
        ("llama3", "\u00fcber\tna\u00efve", ["\u00fcber", "\tna\u00efve"]),
        # gpt2: case-sensitive contractions, numbers unsplit, a whitespace run minus the space
        # before the next word
        ("gpt2", "I'M here's 1234567 x!!\n\n  \n y", ["I", "'", "M", " here", "'s", " 1234567", " x", "!!", "\n\n  \n", " y"]),
        # qwen2: every digit alone
        ("qwen2", "ab 123", ["ab", " ", "1", "2", "3"]),
        # starcoder: digits first, then the gpt2 regex on what is left
        ("starcoder", "ab 123", ["ab", " ", "1", "2", "3"]),
        # default: punctuation runs, gpt2, digit runs, then three-digit groups
        ("default", "Hello, world! 12345", ["Hello", ",", " world", "!", " ", "123", "45"]),
        # deepseek-llm: newlines, Latin-like letters, ASCII/CJK punctuation, CJK runs, digits
        ("deepseek-llm", "Hello \u4e16\u754c\n123", ["Hello", " ", "\u4e16\u754c", "\n", "123"]),
    ],
)
def test_split(pre, text, words):
    got = PreTokenizer(pre).split(text)
    assert got == words
    assert "".join(got) == text


def test_split_empty_and_unknown():
    assert PreTokenizer("llama3").split("") == []
    with pytest.raises(TokenizerError, match="no pre-tokenizer"):
        PreTokenizer("nope")
