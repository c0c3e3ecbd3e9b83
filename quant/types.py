"""One table of GGUF tensor types edged supports: block geometry and the activation format of
their dot product (as llama.cpp's type_traits_cpu maps vec_dot_type)."""

from dataclasses import dataclass

from gguf import GGMLQuantizationType as T


@dataclass(frozen=True)
class TypeTraits:
    qtype: T
    block_size: int  # elements per block
    type_size: int  # bytes per block
    act_format: str  # "f32": float activations; "q8_32": int8 blocks of 32 with f32 scale + int sum


TYPE_TRAITS: dict[T, TypeTraits] = {
    t.qtype: t
    for t in (
        TypeTraits(T.F32, 1, 4, "f32"),
        TypeTraits(T.F16, 1, 2, "f32"),
        TypeTraits(T.BF16, 1, 2, "f32"),
        TypeTraits(T.Q4_0, 32, 18, "q8_32"),
        TypeTraits(T.Q4_1, 32, 20, "q8_32"),
        TypeTraits(T.Q5_0, 32, 22, "q8_32"),
        TypeTraits(T.Q5_1, 32, 24, "q8_32"),
        TypeTraits(T.Q8_0, 32, 34, "q8_32"),
        TypeTraits(T.Q2_K, 256, 84, "q8_32"),
        TypeTraits(T.Q3_K, 256, 110, "q8_32"),
        TypeTraits(T.Q4_K, 256, 144, "q8_32"),
        TypeTraits(T.Q5_K, 256, 176, "q8_32"),
        TypeTraits(T.Q6_K, 256, 210, "q8_32"),
        TypeTraits(T.IQ4_NL, 32, 18, "q8_32"),
        TypeTraits(T.IQ4_XS, 256, 136, "q8_32"),
        # low-bit types (quant/iq_grids.py has their layouts and tables)
        TypeTraits(T.IQ2_XXS, 256, 66, "q8_32"),
        TypeTraits(T.IQ2_XS, 256, 74, "q8_32"),
        TypeTraits(T.IQ2_S, 256, 82, "q8_32"),
        TypeTraits(T.IQ3_XXS, 256, 98, "q8_32"),
        TypeTraits(T.IQ3_S, 256, 110, "q8_32"),
        TypeTraits(T.IQ1_S, 256, 50, "q8_32"),
        TypeTraits(T.IQ1_M, 256, 56, "q8_32"),
        TypeTraits(T.TQ1_0, 256, 54, "q8_32"),
        TypeTraits(T.TQ2_0, 256, 66, "q8_32"),
        TypeTraits(T.MXFP4, 32, 17, "q8_32"),
    )
}

SUPPORTED_TYPES = tuple(TYPE_TRAITS)


def traits(qtype) -> TypeTraits:
    """Traits of a supported type; KeyError-free: raises ValueError naming the type otherwise."""
    try:
        return TYPE_TRAITS[T(qtype)]
    except (KeyError, ValueError):
        names = ", ".join(t.name for t in SUPPORTED_TYPES)
        raise ValueError(f"unsupported tensor type {qtype!r}; supported: {names}") from None


def row_bytes(qtype, n_cols: int) -> int:
    """Bytes of one row of n_cols elements (n_cols must be a multiple of the block size)."""
    tt = traits(qtype)
    if n_cols % tt.block_size:
        raise ValueError(f"{tt.qtype.name} row of {n_cols} is not a multiple of {tt.block_size}")
    return n_cols // tt.block_size * tt.type_size
