"""Tokenizers built from GGUF metadata, exact to llama.cpp: SentencePiece-style ("llama") and
byte-level BPE ("gpt2"), special-token parsing, and streaming detokenization."""

from edged.tokenizer.errors import TokenizerError
from edged.tokenizer.stream import StreamDecoder
from edged.tokenizer.tokenizer import Tokenizer
from edged.tokenizer.vocab import Vocab

__all__ = ["StreamDecoder", "Tokenizer", "TokenizerError", "Vocab"]
