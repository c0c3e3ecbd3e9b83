"""The one error type of edged.structured: a bad constraint in a request, naming its field."""

from __future__ import annotations


class ConstraintError(ValueError):
    """A request's constraint (schema, grammar, regex, choice) cannot be used.

    field: the request field at fault, dotted (e.g. "response_format.json_schema.schema");
    the server answers 400 with this name and `message`.
    """

    def __init__(self, field: str, message: str):
        self.field = field
        self.message = message
        super().__init__(f"{field}: {message}")
