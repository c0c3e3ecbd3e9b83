"""Writing small tokenizer vocabularies to real GGUF files (gguf.GGUFWriter) for the tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from edged.quant import load_gguf
from edged.tokenizer.bpe import BYTE_TO_CHAR

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def write_vocab(
    path: Path,
    model: str,
    tokens: list[str],
    *,
    scores=None,
    types=None,
    merges: list[str] | None = None,
    pre: str | None = None,
    ints: dict[str, int] | None = None,
    bools: dict[str, bool] | None = None,
    raw_arrays: dict[str, tuple[gguf.GGUFValueType, list]] | None = None,
):
    """Writes a tensor-less GGUF holding a tokenizer and returns it opened with load_gguf.

    ints/bools: extra tokenizer.ggml.<key> scalars (e.g. {"bos_token_id": 1}).
    raw_arrays: key -> (element type, values), written as given (for malformed-file tests).
    """
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    if scores is not None:
        w.add_token_scores(list(map(float, scores)))
    if types is not None:
        w.add_token_types(list(map(int, types)))
    if merges is not None:
        w.add_token_merges(merges)
    for k, v in (ints or {}).items():
        w.add_uint32(f"tokenizer.ggml.{k}", v)
    for k, v in (bools or {}).items():
        w.add_bool(f"tokenizer.ggml.{k}", v)
    for k, (etype, values) in (raw_arrays or {}).items():
        w.add_key_value(k, values, gguf.GGUFValueType.ARRAY, sub_type=etype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return load_gguf(path)


def spm_vocab(extra: list[tuple[str, float, int]]) -> tuple[list[str], np.ndarray, list[int]]:
    """A SentencePiece-style vocabulary: <unk> <s> </s>, the 256 byte tokens, then `extra`
    (text, score, type). Ids: <unk>=0, <s>=1, </s>=2, <0xXX>=3+XX, extra from 259."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    for text, score, ttype in extra:
        tokens.append(text)
        scores.append(score)
        types.append(ttype)
    return tokens, np.array(scores, dtype=np.float32), types


def byte_level_alphabet() -> list[str]:
    """The 256 GGUF token texts of single bytes in a byte-level BPE (id = byte value)."""
    return list(BYTE_TO_CHAR)
