"""Model architectures: one module per architecture, a registry keyed by general.architecture."""

from edged.models.errors import ModelError
from edged.models.registry import (ALIASES, ARCHITECTURES, architecture_module, load_model,
                                   supported_architectures)

__all__ = ["ALIASES", "ARCHITECTURES", "ModelError", "architecture_module", "load_model",
           "supported_architectures"]
