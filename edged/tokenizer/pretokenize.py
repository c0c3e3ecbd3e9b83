"""Pre-tokenization for byte-level BPE: splitting text into words by the regexes llama.cpp selects
from tokenizer.ggml.pre.

llama.cpp runs these regexes with std::regex on a "collapsed" copy of the text in which every
non-ASCII code point becomes one byte standing for its class (letter, number, punctuation, mark,
symbol; non-ASCII whitespace becomes \\v), and `\\p{X}` becomes a class of that byte plus the ASCII
members (`unicode_regex_split`). The same is done here with Python's `re` (re.ASCII gives the C
locale's `\\s` and `\\d`), so no Unicode-property regex engine is needed. gpt2 and llama3 have
hand-written splitters in llama.cpp; their regexes below (gpt2 with its final `\\s+` alternative,
which llama.cpp's splitter applies) give the same words. Code point classes come from
`unicodedata` (Python's Unicode version; llama.cpp's table may differ for recently assigned code
points).
"""

from __future__ import annotations

import re
import unicodedata

from edged.tokenizer.errors import TokenizerError

# collapsed stand-ins (llama.cpp's k_ucat_cpt)
_NUMBER, _LETTER, _PUNCT, _MARK, _SYMBOL, _OTHER = "\xd1", "\xd2", "\xd3", "\xd4", "\xd5", "\xd0"
_CAT = {"N": _NUMBER, "L": _LETTER, "P": _PUNCT, "M": _MARK, "S": _SYMBOL}
# White_Space code points above ASCII (llama.cpp's unicode_set_whitespace, from regex's \s)
_WS_NON_ASCII = frozenset([0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
# \p{X} -> collapsed byte + ASCII members (llama.cpp's k_ucat_map)
_UCAT = {
    r"\p{N}": _NUMBER + "0-9",
    r"\p{L}": _LETTER + "A-Za-z",
    r"\p{P}": _PUNCT + r"!-#%-*,-/:-;?-@\[-\]_\{\}",
    r"\p{M}": _MARK,
    r"\p{S}": _SYMBOL + r"\$\+<-\>\^`\|",
    r"\p{Lu}": _LETTER + "A-Za-z",
    r"\p{Ll}": _LETTER + "A-Za-z",
    r"\p{Lt}": _LETTER + "A-Za-z",
    r"\p{Lm}": _LETTER + "A-Za-z",
    r"\p{Lo}": _LETTER + "A-Za-z",
}


class _CollapseTable(dict):
    """str.translate table: ASCII unchanged, anything else -> its class stand-in (filled lazily)."""

    def __missing__(self, cpt: int) -> int:
        if cpt < 128:
            out = cpt
        elif cpt in _WS_NON_ASCII:
            out = 0x0B
        else:
            out = ord(_CAT.get(unicodedata.category(chr(cpt))[0], _OTHER))
        self[cpt] = out
        return out


_COLLAPSE = _CollapseTable()


def collapse(text: str) -> str:
    """One character per code point of `text`, standing for its class (see module docstring)."""
    return text.translate(_COLLAPSE)


def _collapse_regex(expr: str) -> str:
    """llama.cpp's rewrite of `\\p{X}` into collapsed classes (brackets added outside [...])."""
    out = []
    inside = False
    i = 0
    while i < len(expr):
        c = expr[i]
        if c == "[" and (i == 0 or expr[i - 1] != "\\"):
            inside = True
            out.append(c)
        elif inside and c == "]" and expr[i - 1] != "\\":
            inside = False
            out.append(c)
        elif expr.startswith("\\p{", i):
            close = expr.find("}", i + 3)
            pat = expr[i : close + 1]
            if close < 0 or pat not in _UCAT:
                raise TokenizerError(f"unsupported Unicode class in pre-tokenizer regex: {expr[i:i + 8]!r}")
            out.append(_UCAT[pat] if inside else "[" + _UCAT[pat] + "]")
            i = close
        else:
            out.append(c)
        i += 1
    return "".join(out)


_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# gpt-4o (o200k): llama.cpp's rewrite of the tokenizer.json regex without \p{Lu}/\p{Ll}. "Upper" is any
# letter but a-z, "lower" any but A-Z: collapsed non-ASCII letters are both, and marks are not letters
_UPPER, _LOWER, _LEAD = r"(?:(?=[\p{L}])[^a-z])", r"(?:(?=[\p{L}])[^A-Z])", r"[^\r\n\p{L}\p{N}]?"
_GPT4O = (_LEAD + _UPPER + "*" + _LOWER + "+" + _CONTRACTIONS + "?|" + _LEAD + _UPPER + "+" + _LOWER + "*"
          + _CONTRACTIONS + r"?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# pre type -> llama.cpp's regex list, applied one after another to the pieces of the previous one
REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"),
    "gpt2": (_GPT2 + r"|\s+",),  # llama.cpp's custom splitter also takes a lone \s+
    "llama3": (_LLAMA3,),
    "gpt-4o": (_GPT4O,),
    "qwen2": (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",),
    "starcoder": (r"\p{N}", _GPT2),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"),
    "bloom": (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",),
    "deepseek-coder": ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+", r"\p{N}"),
    "deepseek-llm": (
        "[\r\n]",
        "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
        "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
        "\\s+$",
        "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+",
        r"\p{N}+",
    ),
}


class _Step:
    """One regex of the list: on the collapsed text when it uses \\p{..}, else on the code points
    with non-ASCII whitespace replaced by \\v (llama.cpp's std::wregex path)."""

    def __init__(self, expr: str):
        self.collapsed = "\\p{" in expr
        py = _collapse_regex(expr) if self.collapsed else expr
        py = py.replace("$", r"\Z") if py.endswith("$") else py  # ECMAScript $: end of input only
        self.pattern = re.compile(py, re.ASCII)


class PreTokenizer:
    """Splits text into words for one tokenizer.ggml.pre family."""

    def __init__(self, pre: str):
        if pre not in REGEXES:
            raise TokenizerError(f"no pre-tokenizer for '{pre}' (supported: {', '.join(sorted(REGEXES))})")
        self.pre = pre
        self.steps = [_Step(e) for e in REGEXES[pre]]

    def split(self, text: str) -> list[str]:
        """Words of `text`, in order; their concatenation is `text`."""
        if not text:
            return []
        collapsed = wide = None
        bounds = [0, len(text)]  # piece boundaries in code points
        for step in self.steps:
            if step.collapsed:
                collapsed = collapsed if collapsed is not None else collapse(text)
                subject = collapsed
            else:
                if wide is None:
                    wide = "".join("\x0b" if ord(c) in _WS_NON_ASCII else c for c in text) if not text.isascii() else text
                subject = wide
            finditer = step.pattern.finditer
            new = [0]
            for a, b in zip(bounds, bounds[1:]):
                # each piece is searched on its own, as if it were the whole input
                for m in finditer(subject, a, b):
                    s, e = m.span()
                    if s > new[-1]:
                        new.append(s)
                    if e > new[-1]:
                        new.append(e)
                if b > new[-1]:
                    new.append(b)
            bounds = new
        return [text[a:b] for a, b in zip(bounds, bounds[1:])]
