"""Opt-in: llama.cpp's own tokenizer test vocabularies (models/ggml-vocab-*.gguf with .inp/.out,
as used by its test-tokenizer-0) when EDGED_LLAMACPP_VOCAB_DIR points at a copy of them.

The files (1-4 MB each) are not part of this repository; the test is skipped without them.
"""

import os
from pathlib import Path

import pytest

from edged.quant import load_gguf
from edged.tokenizer import Tokenizer

VOCAB_DIR = os.environ.get("EDGED_LLAMACPP_VOCAB_DIR")
NAMES = ["gpt-2", "mpt", "starcoder", "refact", "falcon", "deepseek-coder", "deepseek-llm", "llama-spm", "phi-3",
         "llama-bpe", "qwen2", "command-r"]


@pytest.mark.parametrize("name", NAMES)
def test_llamacpp_vocab(name):
    if not VOCAB_DIR:
        pytest.skip("EDGED_LLAMACPP_VOCAB_DIR is not set")
    base = Path(VOCAB_DIR) / f"ggml-vocab-{name}.gguf"
    if not all(Path(f"{base}{ext}").exists() for ext in ("", ".inp", ".out")):
        pytest.skip(f"{base.name} (+ .inp/.out) not in {VOCAB_DIR}")
    # git checkouts on some systems turn the files' LF into CRLF
    texts = Path(f"{base}.inp").read_bytes().decode().replace("\r\n", "\n").split("\n__ggml_vocab_test__\n")
    texts[-1] = texts[-1].removesuffix("\n")
    outs = Path(f"{base}.out").read_bytes().decode().replace("\r\n", "\n").split("\n")
    tok = Tokenizer.from_gguf(load_gguf(base))
    for text, line in zip(texts, outs):
        # test-tokenizer-0: no BOS/EOS, special-token text not parsed
        assert tok.encode(text, add_special=False, parse_special=False) == [int(x) for x in line.split()], repr(text)
