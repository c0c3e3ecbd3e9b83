"""SentencePiece-style merging on tiny vocabularies, with expected ids derived by hand."""

import pytest

from edged.tokenizer import Tokenizer
from tests.tokenizer.vocab_files import CONTROL, NORMAL, USER_DEFINED, spm_vocab, write_vocab

# ids 0..2 <unk> <s> </s>; byte token of byte b = 3 + b; extra tokens from 259
EXTRA = [
    ("\u2581", -1.0, NORMAL),  # 259
    ("a", -2.0, NORMAL),  # 260
    ("b", -2.0, NORMAL),  # 261
    ("c", -2.0, NORMAL),  # 262
    ("ab", -1.5, NORMAL),  # 263
    ("bc", -1.0, NORMAL),  # 264
    ("\u2581a", -0.8, NORMAL),  # 265
    ("aa", -1.0, NORMAL),  # 266
    ("<sep>", 0.0, CONTROL),  # 267
    ("<hr>", 0.0, USER_DEFINED),  # 268
]
ID = {t: 259 + i for i, (t, _, _) in enumerate(EXTRA)}


def byte(b: int) -> int:
    return 3 + b


@pytest.fixture
def make(tmp_path):
    def _make(extra=EXTRA, **kw):
        tokens, scores, types = spm_vocab(extra)
        return Tokenizer.from_gguf(write_vocab(tmp_path / "spm.gguf", "llama", tokens, scores=scores, types=types, **kw))

    return _make


def test_higher_score_merges_first(make):
    tok = make(bools={"add_space_prefix": False})
    # "ab" (-1.5) and "bc" (-1.0) compete: bc wins, and "a"+"bc" is not a token
    assert tok.encode("abc", add_special=False) == [ID["a"], ID["bc"]]


def test_equal_scores_merge_leftmost_first(make):
    tok = make(bools={"add_space_prefix": False})
    # both pairs of "aaa" are "aa" with equal score: the left pair merges, leaving "a"
    assert tok.encode("aaa", add_special=False) == [ID["aa"], ID["a"]]
    assert tok.encode("aaaa", add_special=False) == [ID["aa"], ID["aa"]]


def test_space_prefix_and_escaping(make):
    tok = make()  # a "llama" model adds the space prefix by default
    # " a b" -> "▁a▁b": ▁+a merges (-0.8); "▁b" is not a token
    assert tok.encode("a b", add_special=False) == [ID["\u2581a"], ID["\u2581"], ID["b"]]
    assert tok.encode("a b") == [1, ID["\u2581a"], ID["\u2581"], ID["b"]]  # add_bos defaults on
    assert make(bools={"add_space_prefix": False}).encode("a b", add_special=False) == [ID["a"], ID["\u2581"], ID["b"]]


def test_space_prefix_after_special_tokens(make):
    tok = make()
    # llama.cpp prefixes every raw fragment that follows a special token (and the first one)
    assert tok.encode("a<sep>b", add_special=False) == [ID["\u2581a"], ID["<sep>"], ID["\u2581"], ID["b"]]
    assert tok.encode("a<hr>b", add_special=False) == [ID["\u2581a"], ID["<hr>"], ID["\u2581"], ID["b"]]
    # control text is plain text without parse_special: bytes of "<sep>" fall back to byte tokens
    plain = tok.encode("a<sep>", add_special=False, parse_special=False)
    assert plain == [ID["\u2581a"]] + [byte(c) for c in b"<sep>"]
    # user-defined tokens are split out even then
    assert tok.encode("a<hr>", add_special=False, parse_special=False) == [ID["\u2581a"], ID["<hr>"]]


def test_byte_fallback(make):
    tok = make(bools={"add_space_prefix": False})
    assert tok.encode("a\u00e9", add_special=False) == [ID["a"], byte(0xC3), byte(0xA9)]
    assert tok.decode([ID["a"], byte(0xC3), byte(0xA9)]) == "a\u00e9"


def test_unknown_without_byte_tokens(make, tmp_path):
    tokens = ["<unk>", "<s>", "</s>", "a"]
    gf = write_vocab(tmp_path / "nobytes.gguf", "llama", tokens, scores=[0, 0, 0, -1], types=[2, 3, 3, 1],
                     bools={"add_space_prefix": False})
    tok = Tokenizer.from_gguf(gf)
    # llama.cpp would throw here (no <0xXX> token); edged emits the unknown token per byte
    assert tok.encode("ab", add_special=False) == [3, 0]


def test_decode_pieces(make):
    tok = make()
    ids = [1, ID["\u2581a"], ID["<sep>"], ID["<hr>"], ID["\u2581"], ID["b"]]
    assert tok.decode(ids) == " a<hr> b"  # control tokens hidden, user-defined shown
    assert tok.decode(ids, skip_special=False) == "<s> a<sep><hr> b"
    assert tok.decode([]) == ""


def test_empty_text(make):
    tok = make()
    assert tok.encode("", add_special=False) == []
    assert tok.encode("") == [1]  # the SentencePiece convention llama.cpp keeps


def test_stream_decoder_holds_partial_characters(make):
    tok = make(bools={"add_space_prefix": False})
    text = "a\u00e9\U0001f600"
    ids = tok.encode(text, add_special=False)
    assert ids == [ID["a"], byte(0xC3), byte(0xA9)] + [byte(b) for b in "\U0001f600".encode()]
    dec = tok.stream_decoder()
    assert [dec.push(i) for i in ids] == ["a", "", "\u00e9", "", "", "", "\U0001f600"]
    assert dec.flush() == ""


@pytest.mark.parametrize(
    "seq",
    [
        [0xC3],  # cut at the end
        [0xA9, 0x61],  # stray continuation byte
        [0xF0, 0x9F, 0x61, 0x98, 0x80],  # interrupted 4-byte character
        [0xE2, 0x82, 0xAC, 0xFF, 0xC3, 0xA9],  # valid, invalid byte, valid
    ],
)
def test_stream_decoder_invalid_bytes_match_decode(make, seq):
    tok = make()
    ids = [byte(b) for b in seq]
    dec = tok.stream_decoder()
    streamed = "".join(dec.push(i) for i in ids) + dec.flush()
    assert streamed == tok.decode(ids) == bytes(seq).decode("utf-8", errors="replace")


def llamacpp_spm(text: str, vocab: dict[str, int], scores: list[float], byte_id) -> list[int]:
    """llm_tokenizer_spm_session::tokenize written literally in Python (one fragment, escaped)."""
    import heapq

    data = text.encode()
    sym = []  # [start, n, prev, next]
    off = 0
    while off < len(data):
        ln = min([1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4][data[off] >> 4], len(data) - off)
        sym.append([off, ln, len(sym) - 1, -1 if off + ln == len(data) else len(sym) + 1])
        off += ln
    queue, rev_merge = [], {}

    def try_add(left, right):
        if left == -1 or right == -1:
            return
        piece = data[sym[left][0] : sym[left][0] + sym[left][1] + sym[right][1]]
        tid = vocab.get(piece)
        if tid is None:
            return
        heapq.heappush(queue, (-scores[tid], left, right, len(piece)))
        rev_merge[piece] = (left, right)

    for i in range(1, len(sym)):
        try_add(i - 1, i)
    while queue:
        _, left, right, size = heapq.heappop(queue)
        ls, rs = sym[left], sym[right]
        if ls[1] == 0 or rs[1] == 0 or ls[1] + rs[1] != size:
            continue
        ls[1] += rs[1]
        rs[1] = 0
        ls[3] = rs[3]
        if rs[3] >= 0:
            sym[rs[3]][2] = left
        try_add(ls[2], left)
        try_add(left, ls[3])
    out = []

    def resegment(s):
        piece = data[s[0] : s[0] + s[1]]
        if piece in vocab:
            out.append(vocab[piece])
        elif piece in rev_merge:
            resegment(sym[rev_merge[piece][0]])
            resegment(sym[rev_merge[piece][1]])
        else:
            out.extend(byte_id(c) for c in piece)

    i = 0
    while sym and i != -1:
        resegment(sym[i])
        i = sym[i][3]
    return out


def test_kernel_matches_literal_llamacpp_spm(tmp_path):
    import random

    rng = random.Random(7)
    alphabet = ["a", "b", "c", "\u2581", "\u00e9", "\u65e5"]
    pieces = set(alphabet[:4])
    while len(pieces) < 60:
        pieces.add("".join(rng.choice(alphabet) for _ in range(rng.randint(2, 5))))
    # few distinct scores, so ties between equal-score pairs are common
    extra = [(p, float(rng.choice([-1, -2, -3, -4])), NORMAL) for p in sorted(pieces)]
    tokens, scores, types = spm_vocab(extra)
    gf = write_vocab(tmp_path / "rand.gguf", "llama", tokens, scores=scores, types=types, bools={"add_space_prefix": False})
    tok = Tokenizer.from_gguf(gf)
    vocab = {t.encode(): i for i, t in enumerate(tokens)}
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
        expected = llamacpp_spm(text, vocab, list(scores), byte)
        assert tok.encode(text.replace("\u2581", " "), add_special=False) == expected, text
