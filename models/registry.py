"""general.architecture → architecture module, with aliases, and `load_model`."""

import importlib

from edged.models.errors import ModelError

# architecture name → module under edged.models (each defines ARCH and load(gf, ops))
ARCHITECTURES = {
    "gemma2": "gemma2",
    "gemma3": "gemma3",
    "gpt-oss": "gpt_oss",
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen3moe": "qwen3moe",
    "phi3": "phi3",
}

# architectures whose GGUF tensors and graph are those of a supported one
ALIASES = {
    "mistral": "llama",
}


def supported_architectures() -> list[str]:
    """Every general.architecture value load_model accepts (aliases included), sorted."""
    return sorted({*ARCHITECTURES, *ALIASES})


def architecture_module(arch: str):
    """The module implementing `arch` (after aliasing); ModelError naming the supported ones."""
    name = ALIASES.get(arch, arch)
    if name not in ARCHITECTURES:
        raise ModelError(f"unsupported architecture {arch!r}; supported: "
                         f"{', '.join(supported_architectures())}")
    return importlib.import_module(f"edged.models.{ARCHITECTURES[name]}")


def load_model(gf, ops=None):
    """Build the model in the GGUF file `gf` (an edged.quant.GGUFFile).

    `ops` is the backend module every layer and the output projection call (default
    edged.backends.cpu); the returned model's `layer_ops[i]` / `output_ops` may be changed later
    to place layers on other backends.
    """
    try:
        mod = architecture_module(gf.architecture)
    except ModelError as e:
        raise ModelError(f"{gf.path}: {e}") from None
    if ops is None:
        import edged.backends.cpu as ops
    return mod.load(gf, ops)
