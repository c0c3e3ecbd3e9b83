"""The tokenizer's single error type."""


class TokenizerError(ValueError):
    """A vocabulary in a GGUF file is malformed or unsupported, or input cannot be tokenized."""
