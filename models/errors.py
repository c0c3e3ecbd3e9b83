"""The error raised for a GGUF file edged cannot run as a model."""


class ModelError(ValueError):
    """Unknown architecture, missing tensor, wrong tensor shape or unsupported hyper-parameter.

    The message names the file (when known), the tensor or key, and what was expected."""
