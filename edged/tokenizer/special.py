"""Splitting special-token text out of raw text before tokenization (llama.cpp's
`tokenizer_st_partition`).

llama.cpp takes the special tokens longest first and, for each, splits every remaining raw-text
fragment at that token's leftmost non-overlapping occurrences. Doing that literally costs one
substring search per special token (Gemma has ~6,400) over the whole text. Here one scan finds every
position where any special token starts (a regex built from the tokens' trie gives the longest token
at each position; its special-token prefixes occur there too), and the llama.cpp procedure then runs
over those occurrences only. The result is the same fragment list.
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
    """Finds special tokens in text, in llama.cpp's order (`ordered_ids`: longest text first)."""

    def __init__(self, ordered_ids: list[int], texts: list[str]):
        self.ordered_ids = list(ordered_ids)
        self._text = {i: texts[i] for i in self.ordered_ids}
        self._rank = {i: r for r, i in enumerate(self.ordered_ids)}
        by_text = {}
        for i in self.ordered_ids:
            by_text.setdefault(self._text[i], i)
        self._by_text = by_text
        self._pattern = re.compile(_trie_regex(list(by_text))) if by_text else None
        # for each special text: the special texts that are prefixes of it (itself included)
        self._prefixes: dict[str, tuple[str, ...]] = {}
        for t in by_text:
            self._prefixes[t] = tuple(t[:k] for k in range(1, len(t) + 1) if t[:k] in by_text)

    def occurrences(self, text: str) -> dict[int, list[int]]:
        """Token id -> ascending start positions of every (possibly overlapping) occurrence."""
        occ: dict[int, list[int]] = {}
        if self._pattern is None:
            return occ
        search, prefixes, by_text = self._pattern.search, self._prefixes, self._by_text
        m = search(text)
        while m is not None:
            p = m.start()
            for t in prefixes[m.group()]:
                occ.setdefault(by_text[t], []).append(p)
            m = search(text, p + 1)
        return occ

    def partition(self, text: str) -> list[Fragment]:
        """Fragments of `text` in order: raw (start, end) ranges and special token ids."""
        occ = self.occurrences(text)
        if not occ:
            return [(0, len(text))] if text else []
        claimed = bytearray(len(text))
        claims: list[tuple[int, int, int]] = []  # (start, end, id)
        for tid in sorted(occ, key=self._rank.__getitem__):
            n = len(self._text[tid])
            ones = b"\x01" * n
            last_end = -1
            for p in occ[tid]:
                # leftmost-first, non-overlapping, and only inside still-raw text
                if p >= last_end and claimed.find(1, p, p + n) < 0:
                    claimed[p : p + n] = ones
                    claims.append((p, p + n, tid))
                    last_end = p + n
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
