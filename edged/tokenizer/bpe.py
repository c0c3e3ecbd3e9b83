"""Byte-level BPE ("gpt2" tokenizer model), exact to llama.cpp's `llm_tokenizer_bpe_session`.

Each pre-tokenized word is UTF-8 encoded and each byte mapped to a printable character (GPT-2's
bytes_to_unicode). Symbols start as those characters; the adjacent pair with the lowest merge rank
(ties: leftmost) merges until no pair has a rank. Final symbols are tokens; a symbol that is not
one contributes the single-byte tokens of its bytes that exist, as llama.cpp does. Words are
independent, so results are cached per word.
"""

from __future__ import annotations

import heapq


def _bytes_to_unicode() -> list[str]:
    """GPT-2's byte -> character map: printable Latin-1 bytes map to themselves, the rest to 256+."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = [""] * 256
    extra = 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in enumerate(BYTE_TO_CHAR)}


def byte_encode(word: str) -> str:
    """The word's UTF-8 bytes as GPT-2 byte characters."""
    return "".join([BYTE_TO_CHAR[b] for b in word.encode("utf-8")])


def byte_decode_text(token_text: str) -> bytes:
    """Bytes of a byte-level token's text (llama.cpp's llama_decode_text, incl. its [UNK_BYTE_..])."""
    out = bytearray()
    for c in token_text:
        b = CHAR_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
        else:
            u = c.encode("utf-8")
            out += b"[UNK_BYTE_0x" + u.hex().encode() + token_text.encode("utf-8") + b"]"
    return bytes(out)


class BpeEncoder:
    """Merges words with a rank table; `encode_word` is cached."""

    def __init__(self, token_to_id: dict[str, int], merges: list[tuple[str, str]], ignore_merges: bool, cache_size: int = 1 << 16):
        self.token_to_id = token_to_id
        self.ranks = {pair: rank for rank, pair in reversed(list(enumerate(merges)))}  # first rank wins
        self.ignore_merges = ignore_merges
        self._cache: dict[str, tuple[int, ...]] = {}
        self._cache_size = cache_size

    def encode_word(self, word: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized word (raw text, not yet byte-encoded)."""
        ids = self._cache.get(word)
        if ids is None:
            ids = self._merge(byte_encode(word))
            if len(self._cache) >= self._cache_size:
                self._cache.clear()
            self._cache[word] = ids
        return ids

    def _merge(self, enc: str) -> tuple[int, ...]:
        vocab = self.token_to_id
        if not enc:
            return ()
        if self.ignore_merges and enc in vocab:
            return (vocab[enc],)
        sym = list(enc)  # symbol texts; "" once merged away
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        ranks = self.ranks
        heap: list[tuple[int, int, int, str]] = []  # (rank, left, right, merged text)
        for i in range(len(sym) - 1):
            r = ranks.get((sym[i], sym[i + 1]))
            if r is not None:
                heap.append((r, i, i + 1, sym[i] + sym[i + 1]))
        heapq.heapify(heap)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not sym[left] or not sym[right] or sym[left] + sym[right] != text:
                continue  # outdated pair
            sym[left], sym[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            p, n = prv[left], nxt[left]
            if p >= 0 and (r := ranks.get((sym[p], text))) is not None:
                heapq.heappush(heap, (r, p, left, sym[p] + text))
            if n >= 0 and (r := ranks.get((text, sym[n]))) is not None:
                heapq.heappush(heap, (r, left, n, text + sym[n]))
        out: list[int] = []
        i = 0
        while i != -1:
            tid = vocab.get(sym[i])
            if tid is not None:
                out.append(tid)
            else:
                # llama.cpp looks each byte of the symbol up as a one-byte token text
                for b in sym[i].encode("utf-8"):
                    t = vocab.get(chr(b)) if b < 0x80 else None
                    if t is not None:
                        out.append(t)
            i = nxt[i]
        return tuple(out)
