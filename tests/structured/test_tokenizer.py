"""LLTokenizer built from GGUF vocabularies: bytes, special marking, EOS ids, tokenize callback."""

import pytest

from edged.structured import build_lltokenizer, lltokenizer_for
from edged.structured.tokenizer import SPECIAL_MARKER
from edged.tokenizer.vocab import ATTR_CONTROL

from tests.structured.conftest import BUILD_SECONDS


def _check(t, sample: str):
    ll, tok = t.ll, t.tok
    assert ll.vocab_size == tok.vocab_size
    assert ll.eos_tokens == list(tok.eos_ids)
    for i in range(tok.vocab_size):
        if tok.vocab.attrs[i] & ATTR_CONTROL:
            assert ll.is_special_token(i), (i, tok.vocab.tokens[i])
            assert t.bytes[i].startswith(SPECIAL_MARKER)
    ids = ll.tokenize_str(sample)  # through the callback: edged's encoder, no BOS, no space prefix
    assert ll.decode_bytes(ids) == sample.encode()
    if not tok.vocab.add_space_prefix:
        assert ids == tok.encode(sample, add_special=False, parse_special=False)
    else:
        assert tok.decode_bytes(tok.encode(sample, add_special=False)) == b" " + sample.encode()
    assert lltokenizer_for(tok) is ll  # kept, not rebuilt


def test_default_model(gemma):
    _check(gemma, '{"name": "Zoë", "n": [1, 2.5e3]}\n')
    tok = gemma.tok
    assert tok.vocab_size == 262144
    nl = tok.vocab.token_to_id["\n"]  # a user-defined token that is text, not special
    assert not gemma.ll.is_special_token(nl) and gemma.bytes[nl] == b"\n"
    soi = tok.vocab.token_to_id["<start_of_image>"]  # user-defined, looks like a marker
    assert gemma.ll.is_special_token(soi)
    print(f"\ndefault model: GGUF tokenizer {BUILD_SECONDS['gguf_tokenizer']:.2f} s, "
          f"LLTokenizer build {BUILD_SECONDS['lltokenizer']:.2f} s")


def test_tiny_spm(tiny_spm):
    _check(tiny_spm, "the capital of France")


def test_tiny_bpe(tiny_bpe):
    _check(tiny_bpe, " the capital of France is Paris")
    eos = tiny_bpe.tok.eos_ids
    assert eos and all(tiny_bpe.ll.is_special_token(i) for i in eos)


def test_padded_vocab(tiny_bpe):
    n = tiny_bpe.tok.vocab_size
    ll = build_lltokenizer(tiny_bpe.tok, n_vocab=n + 20)
    assert ll.vocab_size == n + 20
    assert all(ll.is_special_token(i) for i in range(n, n + 20))
    with pytest.raises(ValueError):
        build_lltokenizer(tiny_bpe.tok, n_vocab=n - 1)
