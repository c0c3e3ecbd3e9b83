"""Request validation for the OpenAI-compatible endpoints.

Each `parse_*` reads its body through a `Body` of field definitions (edged.server.spec: the same
definitions /openapi.json publishes) and returns a plain dataclass, or raises APIError(400) naming
the offending field. Unknown fields are ignored, as OpenAI's server does; wrong types and
out-of-range values are errors, never silently clamped.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from edged.sampling import SamplingParams
from edged.server.errors import bad_request
from edged.server.keep_alive import parse_keep_alive
from edged.server.spec import (VOCAB, AnyOf, Anything, Array, Body, Boolean, Field, Integer, Number,
                               Object, Refine, String, TokenId, Unsupported, fields, type_name)
from edged.structured import Constraint, ConstraintError, constraint_from_request
from edged.toolcall import ToolRequest, ToolError, parse_tool_request

MAX_N = 8  # choices per request
MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_TOP_LOGPROBS = 20
MAX_PROMPTS = 32  # prompts in one /v1/completions batch
MAX_STOP_CHARS = 256
MAX_EMBEDDING_INPUTS = 2048  # inputs per /v1/embeddings request (OpenAI's limit)


@dataclass
class GenerationRequest:
    """What chat and completions have in common, validated."""

    model: str | None
    params: SamplingParams  # seed is the request's; choice i gets seed + i
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None  # None: the endpoint's default
    top_logprobs: int | None = None  # None: no logprobs; 0..20: chosen token (+ that many top)
    # response_format / json_schema / grammar / structured_outputs (edged.structured.forms)
    constraint: Constraint | None = None
    keep_alive: float | None = None  # seconds the model stays loaded afterwards; None: --keep-alive
    prompt_logprobs: int | None = None  # vLLM's field: prompt logprobs in vLLM's shape, this many top


@dataclass
class ChatRequest(GenerationRequest):
    messages: list = field(default_factory=list)
    tools: list | None = None
    tool_request: ToolRequest | None = None  # tools / tool_choice / parallel_tool_calls, validated
    reasoning_format: str | None = None  # per-request override of --reasoning-format


@dataclass
class CompletionRequest(GenerationRequest):
    prompts: list = field(default_factory=list)  # each a str or a list[int]
    echo: bool = False


@dataclass
class EmbeddingRequest:
    model: str | None
    inputs: list  # each a str or a list[int]
    encoding_format: str = "float"  # or "base64": little-endian float32 bytes
    dimensions: int | None = None  # truncate to this many, then renormalise
    keep_alive: float | None = None


@dataclass
class TokenizeRequest:
    content: str
    add_special: bool = False
    with_pieces: bool = False


@dataclass
class DetokenizeRequest:
    tokens: list[int]


# -- field definitions (validation and the OpenAPI document both come from these) ------------------

def _bias_in_vocab(bias: dict, ctx: dict) -> dict[int, float]:
    vocab = ctx.get(VOCAB)
    out = {}
    for k, b in bias.items():
        tid = int(k)
        if vocab is not None and tid >= vocab:
            raise bad_request(f"'logit_bias' token id {tid} is outside the vocabulary "
                              f"(0..{vocab - 1})", "logit_bias", code="invalid_token_id")
        out[tid] = float(b)
    return out


def _keep_alive_seconds(v, ctx) -> float:
    return parse_keep_alive(v)


MODEL = Field("model", String(), description="a model id of /v1/models; the default model when absent")
KEEP_ALIVE = Field("keep_alive", Refine(AnyOf((String(), Number()), what="a duration or a number of seconds"),
                                        _keep_alive_seconds, note="a Go duration (\"5m\", \"1h30m\") or seconds; "
                                        "0 unloads after the request, negative keeps the model loaded"),
                   description="how long the model stays loaded afterwards (Ollama's keep_alive)")

_STOP_STRING = String(min_len=1, max_len=MAX_STOP_CHARS)
_SCHEMA = Anything(("object", "boolean", "string"), description="a JSON schema (an object, a boolean, "
                   "or its JSON text)")

SAMPLING = (
    Field("temperature", Number(0.0, 2.0), default=1.0, description="0 is greedy"),
    Field("top_p", Number(0.0, 1.0, lo_open=True), default=1.0),
    Field("top_k", Integer(-1, VOCAB), default=0, description="0 or -1: off"),
    Field("min_p", Number(0.0, 1.0), default=0.0),
    Field("presence_penalty", Number(-2.0, 2.0), default=0.0),
    Field("frequency_penalty", Number(-2.0, 2.0), default=0.0),
    Field("repetition_penalty", Number(0.0, 10.0, lo_open=True), default=1.0),
    Field("logit_bias", Refine(Object(values=Number(-100.0, 100.0), keys=r"[0-9]+",
                                      keys_why="is not a token id"), _bias_in_vocab),
          description="token id -> bias added to its logit"),
    Field("seed", Integer(-(2**63), 2**64 - 1), description="choice i samples with seed + i"),
    Field("stop", AnyOf((_STOP_STRING, Array(_STOP_STRING, max_items=MAX_STOP)),
                        what="a string or an array of strings")),
    Field("ignore_eos", Boolean(), default=False),
    Field("speculative", Boolean(), default=True,
          description="edged: false opts out of the server's speculative decoding (--spec)"),
)

CONSTRAINTS = (  # one per request (edged.structured.forms)
    Field("response_format", Object(fields=(
        Field("type", String(enum=("text", "json_object", "json_schema")), required=True),
        Field("json_schema", Object(fields=(Field("name", String()), Field("description", String()),
                                            Field("schema", _SCHEMA), Field("strict", Boolean())))),
        Field("schema", _SCHEMA, description="llama-server: json_object with a schema")))),
    Field("json_schema", _SCHEMA, description="llama-server"),
    Field("grammar", String(), description="llama-server: GBNF, root rule `root`"),
    Field("structured_outputs", Object(fields=(
        Field("json", _SCHEMA), Field("regex", String()), Field("choice", Array(String())),
        Field("grammar", String()), Field("json_object", Boolean()),
        Field("disable_any_whitespace", Boolean()))), description="vLLM: exactly one form"),
    Field("guided_json", _SCHEMA, description="vLLM (older)"),
    Field("guided_regex", String(), description="vLLM (older)"),
    Field("guided_choice", Array(String()), description="vLLM (older)"),
    Field("guided_grammar", String(), description="vLLM (older)"),
)

COMMON = (  # chat and completions
    MODEL,
    Field("user", String(), description="accepted, unused"),
    Field("stream", Boolean(), default=False, description="server-sent events ending with data: [DONE]"),
    Field("stream_options", Object(fields=(Field("include_usage", Boolean(), default=False),)),
          description="only with stream: true"),
    Field("max_tokens", Integer(lo=1), description="at most the context left after the prompt"),
    Field("max_completion_tokens", Integer(lo=1)),
    *CONSTRAINTS,
    *SAMPLING,
    Field("n", Integer(1, MAX_N), default=1),
    KEEP_ALIVE,
)
GENERATION = Body("GenerationFields", fields(COMMON))


def _common(v: dict) -> dict:
    """GenerationRequest keyword arguments from the read values of the COMMON fields."""
    stream = v["stream"]
    include_usage = False
    if v["stream_options"] is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        include_usage = bool(v["stream_options"].get("include_usage"))
    max_tokens, mct = v["max_tokens"], v["max_completion_tokens"]
    if mct is not None:
        max_tokens = mct if max_tokens is None else min(max_tokens, mct)
    try:
        constraint = constraint_from_request(v)
    except ConstraintError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None
    seed = v["seed"]
    if seed is not None and seed < 0:  # OpenAI accepts negative seeds
        seed %= 2**64
    try:
        params = SamplingParams(
            temperature=v["temperature"], top_p=v["top_p"], top_k=v["top_k"], min_p=v["min_p"],
            presence_penalty=v["presence_penalty"], frequency_penalty=v["frequency_penalty"],
            repetition_penalty=v["repetition_penalty"], logit_bias=v["logit_bias"] or {}, seed=seed,
            stop=tuple([v["stop"]] if isinstance(v["stop"], str) else v["stop"] or ()),
            ignore_eos=v["ignore_eos"], speculative=v["speculative"])
    except ValueError as e:  # anything SamplingParams checks beyond the ranges above
        raise bad_request(str(e)) from None
    return dict(model=v["model"], params=params, n=v["n"], stream=stream, include_usage=include_usage,
                max_tokens=max_tokens, constraint=constraint, keep_alive=v["keep_alive"])


def _keep_alive(body: dict) -> float | None:
    """The body's keep_alive in seconds (None: absent), for requests that read nothing else."""
    return KEEP_ALIVE.read(body, "", {})


def parse_generation(body: Any, vocab_size: int) -> dict:
    """The fields chat and completions share, validated, as GenerationRequest keyword arguments."""
    return _common(GENERATION.read(body, vocab_size=vocab_size))


def requested_model(body: Any) -> str | None:
    """The body's `model` (None when absent), checked before the model is loaded to parse the
    rest against its vocabulary."""
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type_name(body)}")
    return MODEL.read(body, "", {})


# -- endpoints -------------------------------------------------------------------------------------

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's; "developer" renders as system

_TEXT_PART = Object(fields=(
    Field("type", String(enum=("text",), why="only text parts are supported"), required=True),
    Field("text", String(), required=True)))
_TOOL_CALL = Object(fields=(
    Field("id", String()), Field("type", String()),
    Field("function", Object(fields=(
        Field("name", String(), required=True),
        Field("arguments", AnyOf((String(), Object()), what="a JSON string"),
              description="the arguments as JSON text (an object is accepted)"))), required=True)))
MESSAGE = Object(fields=(
    Field("role", String(enum=CHAT_ROLES), required=True, description="developer renders as system"),
    Field("content", AnyOf((String(), Array(_TEXT_PART)), what="a string, an array of text parts or null")),
    Field("name", String()),
    Field("tool_calls", Array(_TOOL_CALL), description="an assistant's calls"),
    Field("tool_call_id", String(), description="the call a tool message answers")))

_FUNCTION = Object(fields=(
    Field("name", String(pattern=r"[A-Za-z0-9_.\-]{1,64}", why="1-64 of a-z, A-Z, 0-9, '_', '-', '.'"),
          required=True),
    Field("description", String()),
    Field("parameters", Object(), description="a JSON Schema of an object"),
    Field("strict", Boolean())))
PROMPT_LOGPROBS = Field("prompt_logprobs", Integer(0, MAX_TOP_LOGPROBS),
                        description="vLLM: every prompt token's logprob, rank and this many most "
                        "likely tokens (the first token's entry is null)")

TOOLS = (
    Field("tools", Array(Object(fields=(Field("type", String(enum=("function",))),
                                        Field("function", _FUNCTION, required=True))))),
    Field("tool_choice", AnyOf((
        String(enum=("auto", "none", "required")),
        Object(fields=(Field("type", String(enum=("function",)), required=True),
                       Field("function", Object(fields=(Field("name", String(min_len=1), required=True),)),
                             required=True)))),
        what="'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\": ...}}")),
    Field("parallel_tool_calls", Boolean(), description="default true"),
)

CHAT = Body("ChatCompletionRequest", fields(
    Field("messages", Array(MESSAGE, min_items=1), required=True),
    COMMON, TOOLS,
    Field("logprobs", Boolean(), default=False),
    Field("top_logprobs", Integer(0, MAX_TOP_LOGPROBS), description="requires logprobs: true"),
    Field("reasoning_format", String(enum=("none", "auto", "deepseek")),
          description="split <think> into reasoning_content (auto; deepseek means auto) or not"),
    PROMPT_LOGPROBS,
))

_IDS = Array(TokenId(), min_items=1)
# the legacy API's max_tokens 0: the prompt only (with echo and logprobs: its log-probabilities)
_COMPLETION_COMMON = tuple(Field("max_tokens", Integer(lo=0), description="0: no completion (with echo "
                                 "and logprobs: the prompt's log-probabilities only)")
                           if f.name == "max_tokens" else f for f in COMMON)
COMPLETION = Body("CompletionRequest", fields(
    Field("prompt", AnyOf((String(), Array(String(), min_items=1, max_items=MAX_PROMPTS), _IDS,
                           Array(_IDS, min_items=1, max_items=MAX_PROMPTS)),
                          what="a string, an array of strings, an array of token ids or an array of "
                          "token-id arrays (non-empty)"), required=True),
    _COMPLETION_COMMON,
    Field("logprobs", Integer(0, MAX_TOP_LOGPROBS), description="top log-probabilities per token"),
    Field("echo", Boolean(), default=False, description="the prompt before the completion; with "
          "logprobs, the prompt tokens' log-probabilities too (the first null)"),
    PROMPT_LOGPROBS,
    Field("suffix", Unsupported()),
    Field("best_of", Integer(1, MAX_N), description="only equal to n"),
))

_TEXT = String(min_len=1)
EMBEDDINGS = Body("EmbeddingRequest", fields(
    MODEL,
    Field("input", AnyOf((_TEXT, Array(_TEXT, min_items=1, max_items=MAX_EMBEDDING_INPUTS), _IDS,
                          Array(_IDS, min_items=1, max_items=MAX_EMBEDDING_INPUTS)),
                         what="a string, an array of strings, an array of token ids or an array of "
                         "token-id arrays (non-empty)"), required=True,
          description=f"at most {MAX_EMBEDDING_INPUTS} inputs, each within the model's context"),
    Field("encoding_format", String(enum=("float", "base64")), default="float",
          description="base64: the little-endian float32 bytes"),
    Field("dimensions", Integer(lo=1), description="keep the first N, then renormalise"),
    Field("user", String(), description="accepted, unused"),
    KEEP_ALIVE,
))

TOKENIZE = Body("TokenizeRequest", fields(
    MODEL, Field("content", String(), required=True),
    Field("add_special", Boolean(), default=False, description="add the model's BOS"),
    Field("with_pieces", Boolean(), default=False, description="each token as {id, piece}")))

DETOKENIZE = Body("DetokenizeRequest", fields(
    MODEL, Field("tokens", Array(TokenId()), required=True, description="an empty array gives \"\"")))


def parse_chat(body: Any, vocab_size: int) -> ChatRequest:
    """Validate a /v1/chat/completions body."""
    v = CHAT.read(body, vocab_size=vocab_size)
    common = _common(v)
    try:
        tool_request = parse_tool_request(v["tools"], v["tool_choice"], v["parallel_tool_calls"])
    except ToolError as e:
        raise bad_request(f"{e.field}: {e.message}", e.field) from None
    if tool_request.active and common["constraint"] is not None:
        field_ = common["constraint"].field.split(".")[0]
        raise bad_request(f"'{field_}' cannot be combined with tools (unless tool_choice is "
                          "'none')", field_)
    reasoning_format = v["reasoning_format"]
    if reasoning_format == "deepseek":  # llama-server's name for the same split
        reasoning_format = "auto"
    top = None
    if v["logprobs"]:
        top = v["top_logprobs"] or 0
    elif v["top_logprobs"] is not None:
        raise bad_request("'top_logprobs' requires 'logprobs': true", "top_logprobs")
    return ChatRequest(**_with_prompt_logprobs(common, v["prompt_logprobs"]), top_logprobs=top,
                       messages=v["messages"], tools=v["tools"], tool_request=tool_request,
                       reasoning_format=reasoning_format)


def _with_prompt_logprobs(common: dict, vllm_k: int | None, echo_k: int | None = None) -> dict:
    """common with prompt_logprobs (vLLM's field) and the engine's prompt_logprobs: the most top
    entries either form asks for (echo + logprobs needs them for the legacy shape)."""
    if vllm_k is not None and common["stream"]:  # as vLLM
        raise bad_request("'prompt_logprobs' is not available with 'stream': true", "prompt_logprobs")
    asked = [k for k in (vllm_k, echo_k) if k is not None]
    if asked:
        common["params"] = dataclasses.replace(common["params"], prompt_logprobs=max(asked))
    return {**common, "prompt_logprobs": vllm_k}


def parse_completion(body: Any, vocab_size: int) -> CompletionRequest:
    """Validate a /v1/completions body; `prompts` becomes a list of strings and token-id lists."""
    v = COMPLETION.read(body, vocab_size=vocab_size)
    common = _common(v)
    p = v["prompt"]
    prompts = [p] if isinstance(p, str) or isinstance(p[0], int) else list(p)
    if len(prompts) * common["n"] > MAX_PROMPTS:
        raise bad_request(f"prompts x n must be <= {MAX_PROMPTS}", "n")
    top, echo = v["logprobs"], v["echo"]
    if v["best_of"] is not None and v["best_of"] != common["n"]:
        raise bad_request("'best_of' other than n is not supported", "best_of")
    common = _with_prompt_logprobs(common, v["prompt_logprobs"], top if echo else None)
    return CompletionRequest(**common, top_logprobs=top, prompts=prompts, echo=echo)


def parse_embeddings(body: Any, vocab_size: int) -> EmbeddingRequest:
    """Validate a /v1/embeddings body; `inputs` becomes a list of strings and token-id lists."""
    v = EMBEDDINGS.read(body, vocab_size=vocab_size)
    x = v["input"]
    inputs = [x] if isinstance(x, str) or isinstance(x[0], int) else list(x)
    return EmbeddingRequest(v["model"], inputs, v["encoding_format"], v["dimensions"], v["keep_alive"])


def parse_tokenize(body: Any) -> TokenizeRequest:
    """Validate a /tokenize body (llama-server's shape: content, add_special, with_pieces)."""
    v = TOKENIZE.read(body)
    return TokenizeRequest(v["content"], v["add_special"], v["with_pieces"])


def parse_detokenize(body: Any, vocab_size: int) -> DetokenizeRequest:
    """Validate a /detokenize body: {"tokens": [ids]} (an empty list gives "")."""
    return DetokenizeRequest(DETOKENIZE.read(body, vocab_size=vocab_size)["tokens"])
