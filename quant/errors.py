"""The single error type for anything wrong with a GGUF file."""


class GGUFError(ValueError):
    """A GGUF file is malformed or unsupported. The message names the file, the field and, where
    known, the byte offset."""

    def __init__(self, path, field: str, message: str, offset: int | None = None):
        self.path = str(path)
        self.field = field
        self.offset = offset
        where = f" at byte {offset}" if offset is not None else ""
        super().__init__(f"{self.path}: {field}{where}: {message}")
