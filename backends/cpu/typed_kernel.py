"""TypedKernel: one compiled kernel shared by several tensor types, bound to one of them.

Numba re-optimizes a callee into each caller, so per-type @njit wrappers of a shared kernel would
each cost a full compile (~10 s); binding the type's constant in Python costs one call instead.
"""


# a kernel's run-time tuning knobs (tasks, prefetch, mode, threads), all 0: its built-in choices (matmul.py)
DEFAULT_KNOBS = (0, 0, 0, 0)


class TypedKernel:
    """`kernel` bound to one type, with the matmul contract's signature f(w_rows, xq, xd, xs, y)
    (or f(w_rows, x, y) for float weights): calls kernel(*arrays, *extra, *knobs), the knobs
    DEFAULT_KNOBS unless given, so every call has one compiled signature. `inspect_asm`,
    `signatures` and `py_func` are the shared dispatcher's, for VNNI checks and benches."""

    def __init__(self, name: str, kernel, *extra):
        self.__name__ = name
        self.kernel = kernel
        self.extra = extra

    def __call__(self, *arrays, knobs=DEFAULT_KNOBS) -> None:
        self.kernel(*arrays, *self.extra, *knobs)

    @property
    def py_func(self):
        return self.kernel.py_func

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
