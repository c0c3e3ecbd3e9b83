"""The tokenizer built from a GGUF file: encode text to ids and decode ids to text, as llama.cpp."""

from __future__ import annotations

import numpy as np

from edged.tokenizer.bpe import BpeEncoder, byte_decode_text
from edged.tokenizer.errors import TokenizerError
from edged.tokenizer.pretokenize import PreTokenizer
from edged.tokenizer.special import SpecialMatcher
from edged.tokenizer.spm import SpmEncoder
from edged.tokenizer.stream import StreamDecoder
from edged.tokenizer.vocab import (
    ATTR_BYTE,
    ATTR_CONTROL,
    ATTR_NORMAL,
    ATTR_UNKNOWN,
    ATTR_USER_DEFINED,
    Vocab,
)

_HIDDEN = ATTR_CONTROL | ATTR_UNKNOWN  # rendered only when special tokens are shown
_ESCAPED_SPACE = "\u2581"


class Tokenizer:
    """SentencePiece-style ("llama") or byte-level BPE ("gpt2") tokenizer, token for token as
    llama.cpp's `llama_tokenize` / `llama_token_to_piece`.

    Attributes: vocab (the validated Vocab), bos_id, eos_id, eos_ids (every end-of-generation id,
    eos first), vocab_size, add_bos.
    """

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.vocab_size = vocab.n_tokens
        self.bos_id = vocab.bos_id
        self.eos_id = vocab.eos_id
        self.eos_ids: tuple[int, ...] = vocab.eog_ids
        self.add_bos = vocab.add_bos
        self._eog = frozenset(vocab.eog_ids)
        self._match_all = SpecialMatcher(list(vocab.special_ids), vocab.tokens)
        self._match_user_only: SpecialMatcher | None = None  # built on first parse_special=False
        if vocab.model == "llama":
            self._spm = SpmEncoder(vocab.tokens, vocab.scores, self._byte_tokens(), vocab.unk_id)
        else:
            self._pre = PreTokenizer(vocab.pre)
            self._bpe = BpeEncoder(vocab.token_to_id, vocab.merges, vocab.ignore_merges)
        # token id -> piece bytes, filled on first use; [shown special tokens?]
        self._pieces: dict[bool, list[bytes | None]] = {False: [None] * self.vocab_size, True: [None] * self.vocab_size}

    @classmethod
    def from_gguf(cls, gf) -> "Tokenizer":
        """Builds the tokenizer from a GGUFFile's tokenizer.ggml.* metadata (validated)."""
        return cls(Vocab.from_gguf(gf))

    def _byte_tokens(self) -> np.ndarray:
        """[256] byte-fallback token per byte: <0xXX>, else the one-character token (llama.cpp)."""
        t2i = self.vocab.token_to_id
        out = np.full(256, -1, dtype=np.int32)
        for b in range(256):
            tid = t2i.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = t2i.get(chr(b))
            if tid is not None:
                out[b] = tid
        return out

    # ---- encoding ----------------------------------------------------------------------------

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of `text`.

        add_special: add BOS/EOS as the model's tokenizer.ggml.add_bos_token/add_eos_token say.
        parse_special: text of control tokens (e.g. "<start_of_turn>") becomes the token; when
            False only user-defined tokens are split out and control-token text is ordinary text.
        """
        if not isinstance(text, str):
            raise TokenizerError(f"text must be str, not {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise TokenizerError(f"text is not valid Unicode at index {e.start}: {e.reason}") from None
        v = self.vocab
        frags = (self._match_all if parse_special else self._match_user()).partition(text)
        out: list[int] = []
        if add_special and v.add_bos:
            out.append(v.bos_id)
        if v.model == "llama":
            out += self._encode_spm(text, frags)
        else:
            pieces = self._pre.split
            encode_word = self._bpe.encode_word
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                else:
                    for word in pieces(text[f[0] : f[1]]):
                        out += encode_word(word)
        if add_special and v.add_eos:
            out.append(v.eos_id)
        return out

    def _match_user(self) -> SpecialMatcher:
        # parse_special=False still splits user-defined tokens out (llama.cpp, as HF tokenizers)
        if self._match_user_only is None:
            v = self.vocab
            ids = [i for i in v.special_ids if not v.attrs[i] & _HIDDEN]
            self._match_user_only = SpecialMatcher(ids, v.tokens)
        return self._match_user_only

    def _encode_spm(self, text: str, frags) -> list[int]:
        chunks: list[bytes] = []
        starts: list[int] = []
        ends: list[int] = []
        toks: list[int] = []
        pos = 0
        prev_special = True  # llama.cpp: a raw fragment at the start or after a token gets the prefix
        prefix = self.vocab.add_space_prefix
        for f in frags:
            if isinstance(f, int):
                starts.append(0)
                ends.append(0)
                toks.append(f)
                prev_special = True
                continue
            s = text[f[0] : f[1]]
            if prefix and prev_special:
                s = " " + s
            prev_special = False
            b = s.replace(" ", _ESCAPED_SPACE).encode("utf-8")
            chunks.append(b)
            starts.append(pos)
            pos += len(b)
            ends.append(pos)
            toks.append(-1)
        if not toks:
            return []
        return self._spm.encode(b"".join(chunks), starts, ends, toks)

    # ---- decoding ----------------------------------------------------------------------------

    def _check_id(self, token_id) -> int:
        try:
            i = int(token_id)
        except (TypeError, ValueError):
            raise TokenizerError(f"token id must be an integer, not {token_id!r}") from None
        if not 0 <= i < self.vocab_size:
            raise TokenizerError(f"token id {i} is outside the vocabulary (0..{self.vocab_size - 1})")
        return i

    def token_bytes(self, token_id: int, skip_special: bool = True) -> bytes:
        """The bytes one token contributes to decoded text (llama.cpp's token_to_piece).

        skip_special: control and unknown tokens give b"" (llama.cpp's special=false).
        """
        i = self._check_id(token_id)
        cache = self._pieces[not skip_special]
        piece = cache[i]
        if piece is None:
            piece = cache[i] = self._piece(i, not skip_special)
        return piece

    def _piece(self, i: int, show_special: bool) -> bytes:
        attr = int(self.vocab.attrs[i])
        text = self.vocab.tokens[i]
        if attr & _HIDDEN and not show_special:
            return b""
        if attr & (_HIDDEN | ATTR_USER_DEFINED):
            return text.encode("utf-8")
        if attr & ATTR_NORMAL:
            if self.vocab.model == "llama":
                return text.replace(_ESCAPED_SPACE, " ").encode("utf-8")
            return byte_decode_text(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens render as nothing

    def decode_bytes(self, ids, skip_special: bool = True) -> bytes:
        """Concatenated token pieces (no leading-space stripping, no clean-up of spaces)."""
        token_bytes = self.token_bytes
        return b"".join([token_bytes(i, skip_special) for i in ids])

    def decode(self, ids, skip_special: bool = True) -> str:
        """Text of `ids`; invalid UTF-8 (e.g. a lone byte-fallback token) becomes U+FFFD."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    def stream_decoder(self, skip_special: bool = True) -> StreamDecoder:
        """A StreamDecoder over this tokenizer."""
        return StreamDecoder(self, skip_special)

    # ---- token facts -------------------------------------------------------------------------

    def token_text(self, token_id: int) -> str:
        """The token's vocabulary text (SentencePiece tokens keep U+2581 for spaces)."""
        return self.vocab.tokens[self._check_id(token_id)]

    def is_special(self, token_id: int) -> bool:
        """Control or unknown token (hidden in decoded text unless special tokens are shown)."""
        return bool(self.vocab.attrs[self._check_id(token_id)] & _HIDDEN)

    def is_eog(self, token_id: int) -> bool:
        """Whether generating this token ends generation (llama.cpp's llama_vocab_is_eog)."""
        return token_id in self._eog

    def __repr__(self) -> str:
        return f"Tokenizer(model={self.vocab.model!r}, vocab_size={self.vocab_size}, bos={self.bos_id}, eos_ids={self.eos_ids})"
