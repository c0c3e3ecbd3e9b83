"""SentencePiece-style BPE ("llama" tokenizer model), exact to llama.cpp's `llm_tokenizer_spm`.

Per raw-text fragment (spaces already escaped to U+2581): one symbol per UTF-8 character; every
adjacent pair whose concatenation is a vocabulary token is queued with that token's score; the best
pair (highest score, then leftmost) is merged and its new neighbours queued, until the queue is
empty. Each final symbol is its token, or one byte-fallback token `<0xXX>` per byte.

The merge loop runs in a Numba kernel over all fragments of a text at once. The vocabulary lives in
flat arrays: token bytes, offsets, and an open-addressing hash table (FNV-1a, linear probing).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from edged.tokenizer.errors import TokenizerError

_FNV_OFFSET = np.uint64(14695981039346656037)
_FNV_PRIME = np.uint64(1099511628211)
_EMPTY = np.int32(-1)


@nb.njit(cache=True, nogil=True)
def _fnv1a(buf, start, n):
    h = _FNV_OFFSET
    for i in range(start, start + n):
        h = (h ^ np.uint64(buf[i])) * _FNV_PRIME
    return h


@nb.njit(cache=True, nogil=True)
def build_table(tok_bytes, tok_off, n_slots):
    """Hash table [n_slots] int32 of token ids (-1 empty); n_slots a power of two > n_tokens."""
    table = np.full(n_slots, _EMPTY, dtype=np.int32)
    mask = np.uint64(n_slots - 1)
    for tid in range(len(tok_off) - 1):
        start = tok_off[tid]
        slot = _fnv1a(tok_bytes, start, tok_off[tid + 1] - start) & mask
        while table[slot] != _EMPTY:
            slot = (slot + np.uint64(1)) & mask
        table[slot] = tid
    return table


@nb.njit(cache=True, nogil=True)
def lookup(buf, start, n, tok_bytes, tok_off, table):
    """Id of the token whose bytes equal buf[start:start+n], else -1."""
    mask = np.uint64(len(table) - 1)
    slot = _fnv1a(buf, start, n) & mask
    while True:
        tid = table[slot]
        if tid == _EMPTY:
            return -1
        t0 = tok_off[tid]
        if tok_off[tid + 1] - t0 == n:
            same = True
            for k in range(n):
                if tok_bytes[t0 + k] != buf[start + k]:
                    same = False
                    break
            if same:
                return tid
        slot = (slot + np.uint64(1)) & mask


@nb.njit(cache=True, nogil=True)
def _better(h_score, h_left, a, b):
    # llama.cpp's llm_bigram_spm::comparator, inverted: higher score first, then leftmost
    return h_score[a] > h_score[b] or (h_score[a] == h_score[b] and h_left[a] < h_left[b])


@nb.njit(cache=True, nogil=True)
def _heap_push(h_score, h_left, h_right, h_size, n, score, left, right, size):
    h_score[n] = score
    h_left[n] = left
    h_right[n] = right
    h_size[n] = size
    i = n
    while i > 0:
        parent = (i - 1) >> 1
        if not _better(h_score, h_left, i, parent):
            break
        h_score[i], h_score[parent] = h_score[parent], h_score[i]
        h_left[i], h_left[parent] = h_left[parent], h_left[i]
        h_right[i], h_right[parent] = h_right[parent], h_right[i]
        h_size[i], h_size[parent] = h_size[parent], h_size[i]
        i = parent
    return n + 1


@nb.njit(cache=True, nogil=True)
def _heap_pop(h_score, h_left, h_right, h_size, n):
    """Moves the top entry to slot n-1 and restores the heap over the first n-1 entries."""
    last = n - 1
    h_score[0], h_score[last] = h_score[last], h_score[0]
    h_left[0], h_left[last] = h_left[last], h_left[0]
    h_right[0], h_right[last] = h_right[last], h_right[0]
    h_size[0], h_size[last] = h_size[last], h_size[0]
    i = 0
    while True:
        best = i
        c = 2 * i + 1
        if c < last and _better(h_score, h_left, c, best):
            best = c
        if c + 1 < last and _better(h_score, h_left, c + 1, best):
            best = c + 1
        if best == i:
            break
        h_score[i], h_score[best] = h_score[best], h_score[i]
        h_left[i], h_left[best] = h_left[best], h_left[i]
        h_right[i], h_right[best] = h_right[best], h_right[i]
        h_size[i], h_size[best] = h_size[best], h_size[i]
        i = best
    return last


@nb.njit(cache=True, nogil=True)
def _split_chars(buf, s, e, sym_start, sym_n, sym_prev, sym_next):
    """One symbol per UTF-8 character of buf[s:e] (lead-byte length, cut at e), linked in order;
    returns the number of symbols."""
    n_sym = 0
    off = s
    while off < e:
        hb = buf[off] >> 4
        ln = 1 if hb < 12 else (2 if hb < 14 else (3 if hb == 14 else 4))
        ln = min(ln, e - off)
        sym_start[n_sym] = off
        sym_n[n_sym] = ln
        sym_prev[n_sym] = n_sym - 1
        off += ln
        sym_next[n_sym] = n_sym + 1 if off < e else -1
        n_sym += 1
    return n_sym


@nb.njit(cache=True, nogil=True)
def _emit_symbols(buf, sym_start, sym_n, sym_next, tok_bytes, tok_off, table, byte_tok, unk_id, out, n_out):
    """Each symbol's token, else its bytes' fallback tokens (else unk_id), from out[n_out]; returns
    the new count, or -(1 + byte) for a byte with neither."""
    i = 0
    while i != -1:
        tid = lookup(buf, sym_start[i], sym_n[i], tok_bytes, tok_off, table)
        if tid >= 0:
            out[n_out] = tid
            n_out += 1
        else:
            for k in range(sym_start[i], sym_start[i] + sym_n[i]):
                b = byte_tok[buf[k]]
                if b < 0:
                    if unk_id < 0:
                        return -(1 + np.int64(buf[k]))
                    b = unk_id
                out[n_out] = b
                n_out += 1
        i = sym_next[i]
    return n_out


@nb.njit(cache=True, nogil=True)
def encode_fragments(buf, frag_start, frag_end, frag_tok, tok_bytes, tok_off, table, scores, byte_tok, unk_id, out):
    """Tokenizes fragments of `buf` into `out`; returns the count, or -(1 + byte) when a byte has
    no fallback token and there is no unknown token.

    buf: uint8 [n_bytes], escaped UTF-8 of the raw fragments back to back.
    frag_start, frag_end: int64 [n_frags] byte ranges in buf (ignored where frag_tok >= 0).
    frag_tok: int32 [n_frags], a special token id to emit as is, or -1 for a raw fragment.
    byte_tok: int32 [256] byte-fallback token per byte (-1 if none). out: int32 [>= n_bytes + n_frags].
    """
    n_buf = len(buf)
    sym_start = np.empty(n_buf, dtype=np.int64)
    sym_n = np.empty(n_buf, dtype=np.int64)
    sym_prev = np.empty(n_buf, dtype=np.int64)
    sym_next = np.empty(n_buf, dtype=np.int64)
    cap = 3 * n_buf + 4  # n-1 seeds + at most 2 pushes per merge
    h_score = np.empty(cap, dtype=np.float32)
    h_left = np.empty(cap, dtype=np.int64)
    h_right = np.empty(cap, dtype=np.int64)
    h_size = np.empty(cap, dtype=np.int64)
    n_out = 0
    for f in range(len(frag_tok)):
        if frag_tok[f] >= 0:
            out[n_out] = frag_tok[f]
            n_out += 1
            continue
        s, e = frag_start[f], frag_end[f]
        if e <= s:
            continue
        n_sym = _split_chars(buf, s, e, sym_start, sym_n, sym_prev, sym_next)
        # merge adjacent symbols best score first (SentencePiece BPE) until no pair is a token
        n_heap = 0
        for i in range(1, n_sym):
            ln = sym_n[i - 1] + sym_n[i]
            tid = lookup(buf, sym_start[i - 1], ln, tok_bytes, tok_off, table)
            if tid >= 0:
                n_heap = _heap_push(h_score, h_left, h_right, h_size, n_heap, scores[tid], i - 1, i, ln)
        while n_heap > 0:
            n_heap = _heap_pop(h_score, h_left, h_right, h_size, n_heap)
            left, right, size = h_left[n_heap], h_right[n_heap], h_size[n_heap]
            # stale entry: one side already merged away, or a side grew since it was queued
            if sym_n[left] == 0 or sym_n[right] == 0 or sym_n[left] + sym_n[right] != size:
                continue
            sym_n[left] += sym_n[right]
            sym_n[right] = 0
            sym_next[left] = sym_next[right]
            if sym_next[right] >= 0:
                sym_prev[sym_next[right]] = left
            for a, b in ((sym_prev[left], left), (left, sym_next[left])):  # the new pairs either side
                if a >= 0 and b >= 0:
                    ln = sym_n[a] + sym_n[b]
                    tid = lookup(buf, sym_start[a], ln, tok_bytes, tok_off, table)
                    if tid >= 0:
                        n_heap = _heap_push(h_score, h_left, h_right, h_size, n_heap, scores[tid], a, b, ln)
        n_out = _emit_symbols(buf, sym_start, sym_n, sym_next, tok_bytes, tok_off, table, byte_tok, unk_id,
                              out, n_out)
        if n_out < 0:
            return n_out
    return n_out


class SpmEncoder:
    """The vocabulary as flat arrays plus the hash table, and `encode` over fragments."""

    def __init__(self, tokens: list[str], scores: np.ndarray, byte_tok: np.ndarray, unk_id: int | None):
        raw = list(map(str.encode, tokens))  # UTF-8
        lens = np.fromiter(map(len, raw), dtype=np.int64, count=len(raw))
        self.tok_off = np.zeros(len(raw) + 1, dtype=np.int64)  # [n_vocab + 1]
        np.cumsum(lens, out=self.tok_off[1:])
        self.tok_bytes = np.frombuffer(b"".join(raw), dtype=np.uint8)  # [total token bytes]
        n_slots = 1 << max(4, (2 * len(raw) - 1).bit_length())  # load factor <= 1/2
        self.table = build_table(self.tok_bytes, self.tok_off, n_slots)
        self.scores = np.ascontiguousarray(scores, dtype=np.float32)
        self.byte_tok = np.ascontiguousarray(byte_tok, dtype=np.int32)  # [256]
        self.unk_id = -1 if unk_id is None else int(unk_id)

    def encode(self, buf: bytes, frag_start, frag_end, frag_tok) -> list[int]:
        """Token ids of the fragments (see `encode_fragments`)."""
        data = np.frombuffer(buf, dtype=np.uint8)
        out = np.empty(len(data) + len(frag_tok), dtype=np.int32)
        n = encode_fragments(
            data,
            np.asarray(frag_start, dtype=np.int64),
            np.asarray(frag_end, dtype=np.int64),
            np.asarray(frag_tok, dtype=np.int32),
            self.tok_bytes, self.tok_off, self.table, self.scores, self.byte_tok, self.unk_id, out,
        )
        if n < 0:
            raise TokenizerError(f"byte 0x{-n - 1:02X} has no token in this vocabulary (no <0x{-n - 1:02X}> and no unknown token)")
        return out[:n].tolist()
