"""Shared tokenizers for the structured-output tests: built once per session (the default
model's 262k-token LLTokenizer takes a few seconds), tiny SentencePiece and BPE ones always."""

import time

import pytest

from edged.quant import load_gguf
from edged.structured import llg_token_bytes, lltokenizer_for
from edged.tokenizer import Tokenizer
from tests.helpers.model import default_model_path
from tests.helpers.tiny_models import write_tiny_model

BUILD_SECONDS: dict = {}  # what each tokenizer build took (reported by test_tokenizer)


class Tok:
    """An edged Tokenizer, its LLTokenizer and per-id llguidance bytes."""

    def __init__(self, tok: Tokenizer):
        self.tok = tok
        t0 = time.perf_counter()
        self.ll = lltokenizer_for(tok)
        self.build_s = time.perf_counter() - t0
        self.bytes = llg_token_bytes(tok)
        self.byte_id = {}  # single byte -> a token that is exactly that byte
        for i, b in enumerate(self.bytes):
            if len(b) == 1 and b[0] not in self.byte_id:
                self.byte_id[b[0]] = i
        self.byte_id = {bytes([k]): v for k, v in self.byte_id.items()}

    def byte_tokens(self, data: bytes) -> list[int]:
        """One token per byte (so a rejection happens at a known byte offset)."""
        return [self.byte_id[data[i : i + 1]] for i in range(len(data))]

    def encode(self, text: str) -> list[int]:
        """The model's own tokenization of `text` (no BOS, no SentencePiece space prefix)."""
        return self.ll.tokenize_str(text)


def _tiny(tmp_path_factory, arch: str) -> Tok:
    path = write_tiny_model(tmp_path_factory.mktemp(arch) / f"{arch}.gguf", arch)
    return Tok(Tokenizer.from_gguf(load_gguf(path)))


@pytest.fixture(scope="session")
def tiny_spm(tmp_path_factory) -> Tok:
    return _tiny(tmp_path_factory, "gemma3")


@pytest.fixture(scope="session")
def tiny_bpe(tmp_path_factory) -> Tok:
    return _tiny(tmp_path_factory, "qwen2")


@pytest.fixture(scope="session")
def gemma() -> Tok:
    path = default_model_path()  # skips when absent
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf(load_gguf(path))
    BUILD_SECONDS["gguf_tokenizer"] = time.perf_counter() - t0
    t = Tok(tok)
    BUILD_SECONDS["lltokenizer"] = t.build_s
    return t
