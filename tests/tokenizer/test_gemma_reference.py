"""The default model's tokenizer (Gemma 3, SentencePiece-style) against llama.cpp's recorded output."""

import pytest

from edged.quant import load_gguf
from edged.tokenizer import Tokenizer, TokenizerError
from tests.helpers.model import default_model_path, llamacpp_reference

REF = llamacpp_reference()


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.from_gguf(load_gguf(default_model_path()))


@pytest.mark.parametrize("case", REF["tokenize"], ids=lambda c: repr(c["text"][:24]))
def test_tokenize_matches_llamacpp(tok, case):
    assert tok.encode(case["text"], add_special=False) == case["ids"]
    assert tok.encode(case["text"]) == case["ids_with_bos"]


@pytest.mark.parametrize("case", REF["greedy"], ids=lambda c: repr(c["prompt"][:24]))
def test_prompt_ids_and_generated_text_match_llamacpp(tok, case):
    assert tok.encode(case["prompt"]) == case["prompt_ids"]
    # llama-server's text for the generated ids is the concatenation of their pieces
    assert tok.decode(case["ids"]) == case["text"]


@pytest.mark.parametrize("case", REF["tokenize"], ids=lambda c: repr(c["text"][:24]))
def test_round_trip(tok, case):
    text = case["text"]
    if "<bos>" in text:
        # control tokens parsed from text come back only when special tokens are shown
        assert tok.decode(tok.encode(text), skip_special=True) != text
        assert tok.decode(tok.encode(text, add_special=False), skip_special=False) == text
    else:
        assert tok.decode(tok.encode(text)) == text


def test_special_ids_and_flags(tok):
    assert tok.vocab_size == 262144
    assert tok.bos_id == 2 and tok.token_text(2) == "<bos>"
    assert tok.eos_id == 1
    assert tok.eos_ids[0] == 1
    # <end_of_turn> ends a turn; llama.cpp also lists </s> (user-defined id 212 here) as EOG
    assert set(tok.eos_ids) == {1, 106, 212}
    assert tok.is_eog(106) and not tok.is_eog(105)
    assert tok.is_special(105) and not tok.is_special(107)  # <start_of_turn> control, "\n" user-defined
    assert tok.token_text(236743) == "\u2581"
    with pytest.raises(TokenizerError):
        tok.token_text(262144)


def test_parse_special_false_keeps_control_text(tok):
    ids = tok.encode("<start_of_turn>user\n", add_special=False, parse_special=False)
    assert 105 not in ids
    assert 107 in ids  # "\n" is user-defined: still split out, as llama.cpp does
    assert tok.decode(ids) == "<start_of_turn>user\n"
    assert tok.encode("<start_of_turn>user\n", add_special=False) == [105, 2364, 107]


def test_byte_fallback_and_decode(tok):
    # U+10FFFD has no token: four byte-fallback tokens
    ids = tok.encode("\U0010fffd", add_special=False)
    assert [tok.token_text(i) for i in ids] == ["<0xF4>", "<0x8F>", "<0xBF>", "<0xBD>"]
    assert tok.decode(ids) == "\U0010fffd"
    assert tok.decode(ids[:2]) == "\ufffd"  # a cut character decodes to one replacement mark


@pytest.mark.parametrize(
    "text",
    ["Emoji: 😀🎉👩\u200d👩\u200d👧\u200d👦 🇫🇷 ❤️", "日本語のテキストと中文文本，还有한국어 텍스트.", "𝔘𝔫𝔦 ꙮ 🧌 a\U000e0001b \U0010fffd"],
)
def test_stream_decode_equals_decode(tok, text):
    ids = tok.encode(text)
    dec = tok.stream_decoder()
    parts = [dec.push(i) for i in ids]
    parts.append(dec.flush())
    assert "".join(parts) == tok.decode(ids) == text
    assert all("\ufffd" not in p for p in parts)  # never a split character
    assert "".join(parts).encode() == tok.decode_bytes(ids)


def test_long_prompt(tok):
    text = (REF["tokenize"][0]["text"] + " ") * 1200  # ~9.6k tokens
    ids = tok.encode(text)
    assert len(ids) > 8000
    assert tok.decode(ids) == text
