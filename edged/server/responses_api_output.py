"""Output of /v1/responses: generated text -> output items (reasoning, message, function calls)
and the stream events that build them, and the Response object around them.

Whole and streamed replies go through the same OutputBuilder, fed the engine's deltas, so a
streamed response ends with exactly the object a whole one returns. Items open when their first
piece arrives and close together at the end (content after a call still belongs to the one
message item, as chat's single `content`).
"""

from __future__ import annotations

import time
import uuid

from edged.toolcall import OutputParser, StreamDelta


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class OutputBuilder:
    """One generation's output items. feed() each delta's text, then finish(); both return the
    stream events (dicts without sequence_number) in order."""

    def __init__(self, parser: OutputParser | None):
        self.parser = parser
        self.output: list[dict] = []
        self._message: int | None = None  # output index of the message item
        self._reasoning: int | None = None
        self._calls: dict[int, int] = {}  # the parser's call index -> output index
        self._tokens = 0
        self._thought = False  # the reasoning block closed: later tokens are the answer
        self.reasoning_tokens = 0

    # -- feeding -----------------------------------------------------------------------------

    def feed(self, text: str, tokens: int = 1) -> list[dict]:
        self._tokens += tokens
        if self.parser is None:
            pieces = [StreamDelta(content=text)] if text else []
        else:
            pieces = self.parser.feed(text) if text else []
        events = self._pieces(pieces)
        self._count_reasoning(final=False)
        return events

    def finish(self, incomplete: bool) -> list[dict]:
        """The last pieces, then every open item done (the last one `incomplete` when the
        output was cut short). An output with no item gets an empty message."""
        events = self._pieces(self.parser.finish()[0]) if self.parser is not None else []
        self._count_reasoning(final=True)
        if not self.output:
            events += self._open_message()
        for index, item in enumerate(self.output):
            last = index == len(self.output) - 1
            item["status"] = "incomplete" if incomplete and last else "completed"
            events += self._done(index, item)
        return events

    def _pieces(self, pieces: list[StreamDelta]) -> list[dict]:
        events: list[dict] = []
        for p in pieces:
            if p.reasoning_content is not None:
                events += self._reasoning_delta(p.reasoning_content)
            elif p.tool_call is not None:
                events += self._call_delta(p.tool_call)
            elif p.content:
                events += self._content_delta(p.content)
        return events

    def _count_reasoning(self, final: bool) -> None:
        """Output tokens up to the one closing the reasoning block (all, if it never closed)."""
        if self._reasoning is None or self._thought:
            return
        if final or self.parser.reasoning.end in self.parser.text:
            self._thought = True
            self.reasoning_tokens = self._tokens

    # -- items -------------------------------------------------------------------------------

    def _add(self, item: dict) -> dict:
        self.output.append(item)
        return {"type": "response.output_item.added", "output_index": len(self.output) - 1,
                "item": _snapshot(item)}

    def _open_message(self) -> list[dict]:
        item = {"id": new_id("msg"), "type": "message", "status": "in_progress",
                "role": "assistant", "content": []}
        added = self._add(item)
        self._message = len(self.output) - 1
        item["content"].append({"type": "output_text", "text": "", "annotations": [], "logprobs": []})
        return [added, {"type": "response.content_part.added", "item_id": item["id"],
                        "output_index": self._message, "content_index": 0,
                        "part": {"type": "output_text", "text": "", "annotations": [],
                                 "logprobs": []}}]

    def _content_delta(self, text: str) -> list[dict]:
        events = self._open_message() if self._message is None else []
        item = self.output[self._message]
        item["content"][0]["text"] += text
        return events + [{"type": "response.output_text.delta", "item_id": item["id"],
                          "output_index": self._message, "content_index": 0, "delta": text,
                          "logprobs": []}]

    def _reasoning_delta(self, text: str) -> list[dict]:
        events = []
        if self._reasoning is None:
            item = {"id": new_id("rs"), "type": "reasoning", "status": "in_progress",
                    "summary": [], "content": []}
            events.append(self._add(item))
            self._reasoning = len(self.output) - 1
            item["content"].append({"type": "reasoning_text", "text": ""})
            events.append({"type": "response.content_part.added", "item_id": item["id"],
                           "output_index": self._reasoning, "content_index": 0,
                           "part": {"type": "reasoning_text", "text": ""}})
        item = self.output[self._reasoning]
        item["content"][0]["text"] += text
        return events + [{"type": "response.reasoning_text.delta", "item_id": item["id"],
                          "output_index": self._reasoning, "content_index": 0, "delta": text}]

    def _call_delta(self, d) -> list[dict]:
        events = []
        if d.id is not None:  # a new call: its id and name come first
            item = {"id": new_id("fc"), "type": "function_call", "status": "in_progress",
                    "call_id": d.id, "name": d.name, "arguments": ""}
            events.append(self._add(item))
            self._calls[d.index] = len(self.output) - 1
        index = self._calls[d.index]
        item = self.output[index]
        if d.arguments:
            item["arguments"] += d.arguments
            events.append({"type": "response.function_call_arguments.delta", "item_id": item["id"],
                           "output_index": index, "delta": d.arguments})
        return events

    def _done(self, index: int, item: dict) -> list[dict]:
        head = {"item_id": item["id"], "output_index": index}
        events = []
        if item["type"] == "message":
            part = item["content"][0]
            events += [{"type": "response.output_text.done", **head, "content_index": 0,
                        "text": part["text"], "logprobs": []},
                       {"type": "response.content_part.done", **head, "content_index": 0,
                        "part": dict(part)}]
        elif item["type"] == "reasoning":
            part = item["content"][0]
            events += [{"type": "response.reasoning_text.done", **head, "content_index": 0,
                        "text": part["text"]},
                       {"type": "response.content_part.done", **head, "content_index": 0,
                        "part": dict(part)}]
        else:
            events.append({"type": "response.function_call_arguments.done", **head,
                           "name": item["name"], "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index,
                       "item": _snapshot(item)})
        return events


def _snapshot(item: dict) -> dict:
    """A copy of an item as it stands (events must not change when the item grows)."""
    out = dict(item)
    if "content" in out:
        out["content"] = [dict(p) for p in out["content"]]
    return out


# -- the Response object -------------------------------------------------------------------------

def usage(input_tokens: int, output_tokens: int, reasoning_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": output_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


def response_object(rid: str, created_at: int, model: str, echo: dict, status: str,
                    output: list[dict], use: dict | None, error: dict | None = None) -> dict:
    """The Response: `echo` holds the request fields it repeats (responses_api_schemas)."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    out = {"id": rid, "object": "response", "created_at": created_at, "status": status,
           "error": error, "incomplete_details": incomplete, "model": model,
           "output": [_snapshot(i) for i in output], "usage": use, **echo}
    if status in ("completed", "incomplete"):
        out["completed_at"] = int(time.time())
    return out
