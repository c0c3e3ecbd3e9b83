"""TypedKernel: one compiled kernel shared by several tensor types, bound to one of them.

Numba re-optimizes a callee into each caller, so per-type @njit wrappers of a shared kernel would
each cost a full compile (~10 s); binding the type's constant in Python costs one call instead.
"""


class TypedKernel:
    """`kernel` bound to one type, with the matmul contract's signature f(w_rows, xq, xd, xs, y):
    calls kernel(w_rows, xq, xd, xs, y, *extra). `inspect_asm` and `signatures` are the shared
    dispatcher's, for VNNI checks and benches."""

    def __init__(self, name: str, kernel, *extra):
        self.__name__ = name
        self.kernel = kernel
        self.extra = extra

    def __call__(self, w, xq, xd, xs, y) -> None:
        self.kernel(w, xq, xd, xs, y, *self.extra)

    @property
    def signatures(self):
        return self.kernel.signatures

    def inspect_asm(self, signature=None):
        return self.kernel.inspect_asm(signature if signature is not None else self.kernel.signatures[0])

    def __repr__(self) -> str:
        return f"<TypedKernel {self.__name__}>"


def bind(prefix: str, qtype, kernel, *extra) -> TypedKernel:
    """TypedKernel named f"{prefix}_{type name}" (gemv_q4_k, gemm_q8_0, ...)."""
    return TypedKernel(f"{prefix}_{qtype.name.lower()}", kernel, *extra)
