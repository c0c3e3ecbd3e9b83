"""JSON Schemas of the replies /openapi.json documents: OpenAI's objects, stream chunks and error,
llama-server's tokenize, Ollama's replies and NDJSON lines. Members a client may rely on are
required; the rest are listed with their types (replies may carry more members)."""

from __future__ import annotations

STR, INT, NUM, BOOL = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def obj(required: dict | None = None, **optional) -> dict:
    """An object schema: `required` members, then optional ones."""
    required = required or {}
    s: dict = {"type": "object", "properties": {**required, **optional}}
    if required:
        s["required"] = list(required)
    return s


def array(items: dict) -> dict:
    return {"type": "array", "items": items}


def nullable(s: dict) -> dict:
    return {"anyOf": [s, {"type": "null"}]}


def const(v) -> dict:
    return {"const": v}


# -- errors ----------------------------------------------------------------------------------------

ERROR = obj({"error": obj({"message": STR, "type": STR, "param": nullable(STR), "code": nullable(STR)})})
OLLAMA_ERROR = obj({"error": STR})

# -- OpenAI ----------------------------------------------------------------------------------------

USAGE = obj({"prompt_tokens": INT, "completion_tokens": INT, "total_tokens": INT})
FINISH = nullable({"enum": ["stop", "length", "tool_calls", "abort", "error"]})
_TOP = obj({"token": STR, "logprob": NUM, "bytes": array(INT)})
CHAT_LOGPROBS = nullable(obj({"content": array(obj({"token": STR, "logprob": NUM, "bytes": array(INT),
                                                     "top_logprobs": array(_TOP)}))}))
COMPLETION_LOGPROBS = nullable(obj({"tokens": array(STR), "token_logprobs": array(NUM),
                                    "top_logprobs": array({"type": "object", "additionalProperties": NUM}),
                                    "text_offset": array(INT)}))
_CALL = obj({"id": STR, "type": const("function"),
             "function": obj({"name": STR, "arguments": STR})})
CHAT_MESSAGE = obj({"role": const("assistant"), "content": nullable(STR)},
                   tool_calls=array(_CALL), reasoning_content=STR, reasoning=STR)
_HEAD = {"id": STR, "created": INT, "model": STR}

CHAT_COMPLETION = obj({**_HEAD, "object": const("chat.completion"),
                       "choices": array(obj({"index": INT, "message": CHAT_MESSAGE,
                                             "logprobs": CHAT_LOGPROBS, "finish_reason": FINISH})),
                       "usage": USAGE})
_DELTA_CALL = obj({"index": INT}, id=STR, type=const("function"),
                  function=obj(name=STR, arguments=STR))
CHAT_CHUNK = obj({**_HEAD, "object": const("chat.completion.chunk"),
                  "choices": array(obj({"index": INT, "delta": obj(role=STR, content=nullable(STR),
                                                                  reasoning_content=STR,
                                                                  tool_calls=array(_DELTA_CALL)),
                                        "finish_reason": FINISH}, logprobs=CHAT_LOGPROBS))},
                 usage=nullable(USAGE))

TEXT_COMPLETION = obj({**_HEAD, "object": const("text_completion"),
                       "choices": array(obj({"index": INT, "text": STR, "logprobs": COMPLETION_LOGPROBS,
                                             "finish_reason": FINISH})),
                       "usage": USAGE})
TEXT_CHUNK = obj({**_HEAD, "object": const("text_completion"),
                  "choices": array(obj({"index": INT, "text": STR, "finish_reason": FINISH},
                                       logprobs=COMPLETION_LOGPROBS))},
                 usage=nullable(USAGE))

MODEL_CARD = obj({"id": STR, "object": const("model"), "created": INT, "owned_by": STR},
                 status={"enum": ["loaded", "loading", "unloading", "unloaded"]}, max_model_len=INT)
MODEL_LIST = obj({"object": const("list"), "data": array(MODEL_CARD)})
HEALTH = obj({"status": STR}, error=STR)
TOKENS = obj({"tokens": {"anyOf": [array(INT), array(obj({"id": INT, "piece": STR}))]}})
CONTENT = obj({"content": STR})
OPENAPI_DOC = obj({"openapi": STR, "info": {"type": "object"}, "paths": {"type": "object"}})


def sse_events(chunk: dict) -> dict:
    """One server-sent event of a stream: `data:` is a chunk, an error object, or [DONE] last
    (schemathesis reads `schema` of text/event-stream as one event, as OpenAPI 3.1 tools do)."""
    return obj({"data": {"if": const("[DONE]"), "else": {
        "contentMediaType": "application/json", "contentSchema": {"anyOf": [chunk, ERROR]}}}})


# -- Ollama ----------------------------------------------------------------------------------------

_DETAILS = obj({"format": STR, "family": STR, "families": array(STR), "parameter_size": STR,
                "quantization_level": STR}, parent_model=STR)
_TAG = obj({"name": STR, "model": STR, "modified_at": STR, "size": INT, "digest": STR,
            "details": _DETAILS})
OLLAMA_TAGS = obj({"models": array(_TAG)})
OLLAMA_PS = obj({"models": array(obj({"name": STR, "model": STR, "size": INT, "digest": STR,
                                      "details": _DETAILS, "expires_at": STR, "size_vram": INT,
                                      "context_length": INT}))})
OLLAMA_SHOW = obj({"modelfile": STR, "parameters": STR, "template": STR, "details": _DETAILS,
                   "model_info": {"type": "object"}, "capabilities": array(STR)}, modified_at=STR)
OLLAMA_VERSION = obj({"version": STR}, edged=STR)
_OLLAMA_STATS = dict(total_duration=INT, load_duration=INT, prompt_eval_count=INT,
                     prompt_eval_duration=INT, eval_count=INT, eval_duration=INT)
_OLLAMA_CALL = obj({"function": obj({"name": STR, "arguments": {"type": "object"}})},
                   id=STR)
_OLLAMA_LOGPROBS = array(obj({"token": STR, "logprob": NUM}))
OLLAMA_CHAT = obj({"model": STR, "created_at": STR, "done": BOOL,
                   "message": obj({"role": const("assistant"), "content": STR}, thinking=STR,
                                  tool_calls=array(_OLLAMA_CALL))},
                  done_reason=STR, logprobs=_OLLAMA_LOGPROBS, **_OLLAMA_STATS)
OLLAMA_GENERATE = obj({"model": STR, "created_at": STR, "done": BOOL, "response": STR},
                      thinking=STR, done_reason=STR, context=array(INT), logprobs=_OLLAMA_LOGPROBS,
                      **_OLLAMA_STATS)
OLLAMA_PULL = obj({"status": STR}, digest=STR, total=INT, completed=INT)


def ndjson_line(line: dict) -> dict:
    """One line of an application/x-ndjson stream: the object, or an error as the last line."""
    return {"anyOf": [line, OLLAMA_ERROR]}


# -- Anthropic -------------------------------------------------------------------------------------

ANTHROPIC_ERROR = obj({"type": const("error"), "error": obj({"type": STR, "message": STR})})
_A_BLOCK = {"anyOf": [obj({"type": const("text"), "text": STR}),
                      obj({"type": const("thinking"), "thinking": STR, "signature": STR}),
                      obj({"type": const("tool_use"), "id": STR, "name": STR, "input": {"type": "object"}})]}
_A_STOP = {"stop_reason": nullable({"enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use",
                                             "pause_turn"]}),
           "stop_sequence": nullable(STR)}
ANTHROPIC_MESSAGE = obj({"id": STR, "type": const("message"), "role": const("assistant"), "model": STR,
                         "content": array(_A_BLOCK), **_A_STOP,
                         "usage": obj({"input_tokens": INT, "output_tokens": INT})})
_A_DELTA = {"anyOf": [obj({"type": const("text_delta"), "text": STR}),
                      obj({"type": const("thinking_delta"), "thinking": STR}),
                      obj({"type": const("input_json_delta"), "partial_json": STR})]}
ANTHROPIC_EVENT = {"anyOf": [  # each event's `data`; its `event:` line repeats the type
    obj({"type": const("message_start"), "message": ANTHROPIC_MESSAGE}),
    obj({"type": const("ping")}),
    obj({"type": const("content_block_start"), "index": INT, "content_block": _A_BLOCK}),
    obj({"type": const("content_block_delta"), "index": INT, "delta": _A_DELTA}),
    obj({"type": const("content_block_stop"), "index": INT}),
    obj({"type": const("message_delta"), "delta": obj(_A_STOP), "usage": obj({"output_tokens": INT})}),
    obj({"type": const("message_stop")}),
    ANTHROPIC_ERROR]}
ANTHROPIC_TOKEN_COUNT = obj({"input_tokens": INT})


# -- Responses API (/v1/responses) -----------------------------------------------------------------

RESPONSE = obj({"id": STR, "object": const("response"), "created_at": INT,
                "status": {"enum": ["completed", "incomplete", "failed", "in_progress"]},
                "error": nullable(obj({"code": STR, "message": STR})), "model": STR,
                "output": array({"type": "object"}), "usage": nullable({"type": "object"})},
               incomplete_details=nullable({"type": "object"}), completed_at=INT)
RESPONSE_EVENT = {"anyOf": [obj({"type": STR, "sequence_number": INT}, response=RESPONSE),
                            obj({"type": const("error"), "message": STR}, code=nullable(STR),
                                param=nullable(STR))]}
RESPONSE_DELETED = obj({"id": STR, "object": const("response"), "deleted": const(True)})
