"""Click options shared by several commands (one definition each)."""

import click

model_argument = click.argument("model", required=False)


def sampling_options(f=None, *, max_tokens: int | None = 128):
    """--max-tokens, --temperature, --top-k, --top-p, --min-p, --seed (llama.cpp's defaults).
    max_tokens: the --max-tokens default; None = until the reply ends or the context is full."""
    if f is None:  # used as @sampling_options(max_tokens=None)
        return lambda g: sampling_options(g, max_tokens=max_tokens)
    for opt in reversed([
        click.option("--max-tokens", "-n", type=int, default=max_tokens, show_default=max_tokens is not None,
                     help="Tokens to generate at most." if max_tokens is not None else
                     "Tokens to generate at most per reply (default: until it ends or the context is full)."),
        click.option("--temperature", type=float, default=0.8, show_default=True,
                     help="0 = greedy."),
        click.option("--top-k", type=int, default=40, show_default=True, help="0 = off."),
        click.option("--top-p", type=float, default=0.95, show_default=True),
        click.option("--min-p", type=float, default=0.05, show_default=True),
        click.option("--seed", type=int, default=None, help="Random seed (reproducible sampling)."),
    ]):
        f = opt(f)
    return f


def kv_type_option(f=None, *, envvar: str | None = None):
    """--kv-type f32|f16|q8_0: the KV cache's element type (default f16, as llama.cpp's -ctk/-ctv).
    envvar: also read that variable (`edged serve`)."""
    if f is None:  # used as @kv_type_option(envvar="EDGED_KV_TYPE")
        return lambda g: kv_type_option(g, envvar=envvar)
    from edged.backends.base import KV_DEFAULT, KV_TYPES

    return click.option("--kv-type", type=click.Choice(KV_TYPES), default=KV_DEFAULT, show_default=True,
                        envvar=envvar, show_envvar=envvar is not None,
                        help="KV cache element type: f16 takes half of f32's memory, q8_0 (int8 values, "
                             "a float16 scale per 32) 34/128 of it.")(f)


def backend_options(f):
    """--backend and --gpu-layers (hybrid CPU/GPU offload; see edged/offload.py)."""
    for opt in reversed([
        click.option("--backend", type=click.Choice(["auto", "cpu", "cuda"]), default="auto",
                     show_default=True,
                     help="Where kernels run: auto = cuda when a usable GPU is present, else cpu."),
        click.option("--gpu-layers", "-ngl", default="auto", show_default=True,
                     help="Layers on the GPU (the first N; N >= layer count adds the output "
                          "projection), or auto = as many as fit in free device memory."),
    ]):
        f = opt(f)
    return f


def spec_options(f=None, *, envvar_prefix: str | None = None):
    """--spec, --spec-max, --draft, --draft-p-min and --spec-adaptive: speculative decoding
    (edged.engine.spec_ngram, spec_draft, spec_governor). envvar_prefix: also read EDGED_SPEC etc.
    (`edged serve`, whose every flag is a variable)."""
    if f is None:  # used as @spec_options(envvar_prefix="EDGED_")
        return lambda g: spec_options(g, envvar_prefix=envvar_prefix)
    env = {} if envvar_prefix is None else {"show_envvar": True}
    for opt in reversed([
        click.option("--spec", type=click.Choice(["off", "ngram"]), default="off", show_default=True,
                     envvar=f"{envvar_prefix}SPEC" if envvar_prefix else None, **env,
                     help="Speculative decoding: ngram drafts tokens from the request's own context "
                          "(prompt lookup) and verifies them in one forward pass; outputs unchanged."),
        click.option("--spec-max", type=click.IntRange(1, 64), default=8, show_default=True,
                     envvar=f"{envvar_prefix}SPEC_MAX" if envvar_prefix else None, **env,
                     help="Draft tokens verified per sequence and step at most."),
        click.option("--draft", default=None, envvar=f"{envvar_prefix}DRAFT" if envvar_prefix else None, **env,
                     help="Draft model (a .gguf path or a store name) with the model's vocabulary: it "
                          "proposes tokens the model verifies in one forward pass; outputs unchanged."),
        click.option("--draft-p-min", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True,
                     envvar=f"{envvar_prefix}DRAFT_P_MIN" if envvar_prefix else None, **env,
                     help="The draft stops proposing where its top token's probability is below this "
                          "(0: it proposes --spec-max tokens every step)."),
        click.option("--spec-adaptive/--spec-always", default=True, show_default=True,
                     envvar=f"{envvar_prefix}SPEC_ADAPTIVE" if envvar_prefix else None, **env,
                     help="--draft: draft only at the batch sizes where decode steps with drafts "
                          "measured faster than those without (--spec-always: at every step)."),
    ]):
        f = opt(f)
    return f


def spec_setting(spec: str, draft: str | None = None) -> str | None:
    """EngineConfig.spec from the --spec choice and --draft."""
    if draft:
        if spec != "off":
            raise click.UsageError(f"--draft and --spec {spec}: choose one kind of speculation")
        return "draft"
    return None if spec == "off" else spec
