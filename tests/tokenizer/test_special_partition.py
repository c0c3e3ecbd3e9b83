"""Special-token partition in llama.cpp's order: longest token first, leftmost occurrences."""

import pytest

from edged.tokenizer.special import SpecialMatcher


def partition(tokens: list[str], text: str):
    """Fragments with raw ranges shown as their text and tokens as their text in angle quotes."""
    by_len = sorted(range(len(tokens)), key=lambda i: (-len(tokens[i]), i))
    frags = SpecialMatcher(by_len, tokens).partition(text)
    return [text[f[0] : f[1]] if isinstance(f, tuple) else f"«{tokens[f]}»" for f in frags]


@pytest.mark.parametrize(
    "tokens,text,expected",
    [
        # the longer token claims its text first even though the shorter one starts earlier
        (["ab", "bcd"], "abcd", ["a", "«bcd»"]),
        (["ab", "bcd"], "abxbcd", ["«ab»", "x", "«bcd»"]),
        # leftmost, non-overlapping occurrences of one token
        (["aa"], "aaa", ["«aa»", "a"]),
        (["aa"], "aaaa", ["«aa»", "«aa»"]),
        # a token nested in a longer one only matches outside it
        (["<s>", "</s>"], "<s>x</s><s>", ["«<s>»", "x", "«</s>»", "«<s>»"]),
        # runs of a repeated character: longest token first, remainder by shorter ones
        (["  ", "   "], "a     b", ["a", "«   »", "«  »", "b"]),
        (["\n", "\n\n"], "\n\n\nx\n", ["«\n\n»", "«\n»", "x", "«\n»"]),
        # an occurrence of a shorter token across the edge of a claimed one does not count
        (["xab", "bc"], "xabc", ["«xab»", "c"]),
        ([], "plain", ["plain"]),
        (["<a>"], "", []),
    ],
)
def test_partition(tokens, text, expected):
    assert partition(tokens, text) == expected


def test_present_includes_overlaps_and_prefixes():
    tokens = ["a", "aa", "ab", "ba", "b"]
    m = SpecialMatcher([1, 2, 3, 0, 4], tokens)
    assert m.present("aab") == {0, 1, 2, 4}  # "ab" starts inside "aa"; "a" is a prefix of "aa"
    assert m.present("xyz") == set()


def test_long_runs_are_found_exactly():
    tokens = ["  ", "   ", " x", "y "]
    m = SpecialMatcher([1, 2, 3, 0], tokens)
    run = " " * 10_000
    assert m.present("y" + run + "x") == {0, 1, 2, 3}
    assert m.present(run) == {0, 1}
    frags = m.partition("a" + run + "x")
    # 3-space tokens first, leftmost: 3333 of them, then one " x" cannot fit (its space is taken)...
    assert frags[0] == (0, 1) and frags[1:3334] == [1] * 3333
    assert frags[3334:] == [2]  # ...so the last space joins "x" as " x"


def llamacpp_partition(ordered: list[str], text: str):
    """llama.cpp's tokenizer_st_partition written literally: per token, per fragment, find/split."""
    frags = [(0, len(text))] if text else []
    for tok in ordered:
        out = []
        for f in frags:
            if not isinstance(f, tuple):
                out.append(f)
                continue
            start, end = f
            while True:
                p = text.find(tok, start, end)
                if p < 0:
                    break
                if p > start:
                    out.append((start, p))
                out.append(tok)
                start = p + len(tok)
            if start < end:
                out.append((start, end))
        frags = out
    return [text[f[0] : f[1]] if isinstance(f, tuple) else f"«{f}»" for f in frags]


def test_partition_matches_literal_llamacpp_algorithm():
    import random

    rng = random.Random(1234)
    for _ in range(400):
        alphabet = "ab<>/ \n"[: rng.randint(2, 7)]
        tokens = list({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 6))})
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        ordered = [tokens[i] for i in sorted(range(len(tokens)), key=lambda i: (-len(tokens[i]), i))]
        assert partition(tokens, text) == llamacpp_partition(ordered, text), (tokens, text)
