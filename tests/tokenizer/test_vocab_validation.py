"""Malformed vocabularies are rejected at load with a TokenizerError naming the problem."""

import gguf
import pytest

from edged.quant import load_gguf
from edged.tokenizer import Tokenizer, TokenizerError
from tests.tokenizer.vocab_files import BYTE, NORMAL, byte_level_alphabet, write_vocab

SPM_TOKENS = ["<unk>", "<s>", "</s>", "a", "b"]


def load(tmp_path, model="llama", tokens=SPM_TOKENS, **kw):
    return Tokenizer.from_gguf(write_vocab(tmp_path / "v.gguf", model, tokens, **kw))


def test_valid_minimal_vocab_loads(tmp_path):
    tok = load(tmp_path, scores=[0, 0, 0, -1, -1], types=[2, 3, 3, 1, 1])
    assert tok.vocab_size == 5 and tok.bos_id == 1 and tok.eos_ids == (2,)


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"scores": [0.0, 0.0]}, "tokenizer.ggml.scores has 2 entries, tokenizer.ggml.tokens 5"),
        ({"types": [1, 1, 1]}, "tokenizer.ggml.token_type has 3 entries"),
        ({"types": [1, 1, 1, 1, 9]}, r"token_type\[4\] = 9 is not a token type"),
        ({"ints": {"bos_token_id": 5}}, "bos_token_id = 5 is outside the vocabulary"),
        ({"ints": {"eot_token_id": 99}}, "eot_token_id = 99 is outside the vocabulary"),
        ({"tokens": ["<unk>", "<s>", "</s>", "<0xZZ>"], "types": [2, 3, 3, BYTE]}, "has type BYTE but is not of the form <0xXX>"),
        ({"tokens": ["<unk>", "<s>", "</s>", "a", "a"]}, "duplicate token in vocabulary: 'a' has ids 3 and 4"),
        ({"tokens": ["<unk>"]}, "add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"),
        ({"model": "bert"}, "tokenizer.ggml.model 'bert' is not supported"),
    ],
)
def test_rejected(tmp_path, kw, match):
    with pytest.raises(TokenizerError, match=match):
        load(tmp_path, **kw)


def test_out_of_range_padding_id_is_ignored_like_llamacpp(tmp_path, caplog):
    tok = load(tmp_path, ints={"padding_token_id": 5})
    assert tok.vocab.pad_id is None
    assert "padding_token_id = 5 is outside the vocabulary" in caplog.text


def test_wrong_stored_type_is_a_clear_error(tmp_path):
    # scores stored as strings: the typed accessor refuses them
    with pytest.raises(ValueError, match="tokenizer.ggml.scores"):
        load(tmp_path, raw_arrays={"tokenizer.ggml.scores": (gguf.GGUFValueType.STRING, ["x"] * 5)})


@pytest.mark.parametrize(
    "merges,match",
    [
        (["a €"], "merges\\[0\\] 'a €' refers to '€', which is not a token"),
        (["ab"], "merges\\[0\\] 'ab' is not two tokens separated by a space"),
        (["a b", "b c"], "merges\\[1\\] 'b c' refers to 'bc'"),
    ],
)
def test_bad_merges(tmp_path, merges, match):
    tokens = byte_level_alphabet() + ["ab"]
    with pytest.raises(TokenizerError, match=match):
        load(tmp_path, model="gpt2", tokens=tokens, merges=merges, pre="gpt-2")


def test_gpt2_without_merges(tmp_path):
    with pytest.raises(TokenizerError, match="tokenizer.ggml.merges is missing"):
        load(tmp_path, model="gpt2", tokens=byte_level_alphabet(), pre="gpt-2")


def test_file_without_tokenizer(tmp_path):
    path = tmp_path / "none.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer.from_gguf(load_gguf(path))


def test_empty_token_gets_llamacpp_placeholder(tmp_path):
    tok = load(tmp_path, tokens=["<unk>", "<s>", "</s>", ""], types=[2, 3, 3, NORMAL])
    assert tok.token_text(3) == "[EMPTY_3]"


def test_bad_ids_in_decode(tmp_path):
    tok = load(tmp_path)
    with pytest.raises(TokenizerError, match="token id 5 is outside the vocabulary"):
        tok.decode([3, 5])
    with pytest.raises(TokenizerError):
        tok.decode([-1])
    with pytest.raises(TokenizerError, match="text must be str"):
        tok.encode(b"bytes")
    with pytest.raises(TokenizerError, match="not valid Unicode"):
        tok.encode("a\ud800b")
