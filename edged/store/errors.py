"""Errors of the model store: one base class, and "no such model" apart (a 404 for the servers)."""


class StoreError(Exception):
    """A store operation failed; the message names the model, file or package."""


class ModelNotFoundError(StoreError):
    """No complete entry of that name in the store."""
