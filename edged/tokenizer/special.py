"""Splitting special-token text out of raw text before tokenization (llama.cpp's
`tokenizer_st_partition`).

llama.cpp takes the special tokens longest first and, for each, splits every remaining raw-text
fragment at that token's leftmost non-overlapping occurrences. Doing that literally costs one
substring search per special token (Gemma has ~6,400) over the whole text. Here one regex scan
finds which special tokens occur at all (a regex built from the tokens' trie gives the longest token
at each position; its special-token prefixes occur there too), and the llama.cpp procedure then runs
for those tokens only. The result is the same fragment list.
"""

from __future__ import annotations

import re

# A fragment is either (start, end) of raw text or a token id (int).
Fragment = tuple[int, int] | int


def _trie_regex(texts: list[str]) -> str:
    """Regex matching the longest of `texts` at a position (alternation over a character trie)."""
    trie: dict = {}
    for t in texts:
        node = trie
        for ch in t:
            node = node.setdefault(ch, {})
        node[""] = True

    def emit(node: dict) -> str:
        alts = [re.escape(ch) + emit(child) for ch, child in sorted(node.items()) if ch != ""]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        # an end of a token here: try the longer continuations first, then stop here
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


class SpecialMatcher:
    """Splits special tokens out of text in llama.cpp's order (`ordered_ids`: longest text first)."""

    def __init__(self, ordered_ids: list[int], texts: list[str]):
        self.ordered_ids = list(ordered_ids)
        self._text = {i: texts[i] for i in self.ordered_ids}
        self._rank = {i: r for r, i in enumerate(self.ordered_ids)}
        by_text: dict[str, int] = {}
        for i in self.ordered_ids:
            by_text.setdefault(self._text[i], i)
        self._by_text = by_text
        # a lookahead finds the longest token at every position, overlapping ones included
        self._scan = re.compile("(?=(" + _trie_regex(list(by_text)) + "))", re.S) if by_text else None
        # for each special text: the special texts that are prefixes of it (itself included)
        self._prefixes = {t: tuple(t[:k] for k in range(1, len(t) + 1) if t[:k] in by_text) for t in by_text}
        # Runs of a character that starts a token with itself twice ("  ", "\n\n") are shortened
        # before the scan (see `present`); in other runs the trie walk stops within two steps.
        self._run_keep = 2 * max((len(t) for t in by_text), default=0) + 2
        run_chars = sorted({t[0] for t in by_text if len(t) > 1 and t[1] == t[0]})
        self._long_run = (
            re.compile("([%s])\\1{%d,}" % ("".join(map(re.escape, run_chars)), self._run_keep)) if run_chars else None
        )

    def present(self, text: str) -> set[int]:
        """Ids of the special tokens occurring anywhere in `text`."""
        if self._scan is None:
            return set()
        # Cutting the middle out of a long run of one character changes no answer: every token
        # inside the run is shorter than what is kept, and one crossing an edge keeps its edge.
        # It keeps the scan linear on inputs such as 100k spaces.
        short = self._long_run.sub(lambda m: m.group(1) * self._run_keep, text) if self._long_run else text
        longest = {m.group(1) for m in self._scan.finditer(short)}
        return {self._by_text[p] for t in longest for p in self._prefixes[t]}

    def partition(self, text: str) -> list[Fragment]:
        """Fragments of `text` in order: raw (start, end) ranges and special token ids."""
        tokens = self.present(text)
        if not tokens:
            return [(0, len(text))] if text else []
        claimed = bytearray(len(text))
        claims: list[tuple[int, int, int]] = []  # (start, end, id)
        for tid in sorted(tokens, key=self._rank.__getitem__):
            tok = self._text[tid]
            n = len(tok)
            ones = b"\x01" * n
            pos = 0
            # leftmost non-overlapping occurrences that lie wholly in still-raw text
            while (p := text.find(tok, pos)) >= 0:
                j = claimed.rfind(1, p, p + n)
                if j < 0:
                    claimed[p : p + n] = ones
                    claims.append((p, p + n, tid))
                    pos = p + n
                else:
                    # any occurrence starting at or before j, or inside the claimed stretch, overlaps it
                    pos = claimed.find(0, j + 1)
                    if pos < 0:
                        break
        claims.sort()
        frags: list[Fragment] = []
        pos = 0
        for start, end, tid in claims:
            if start > pos:
                frags.append((pos, start))
            frags.append(tid)
            pos = end
        if pos < len(text):
            frags.append((pos, len(text)))
        return frags
