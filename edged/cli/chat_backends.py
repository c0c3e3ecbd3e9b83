"""Where `edged chat` gets its replies: a model loaded in this process (EngineBackend) or a running
OpenAI-compatible server (HTTPBackend). Both turn a message list into a Reply: an iterator of text
pieces that can be interrupted from the SIGINT handler and reports its token counts at the end."""

from __future__ import annotations

import itertools
import json
import time
from dataclasses import dataclass


class ChatError(Exception):
    """A turn that failed (context full, server error, generation error): shown, and the chat goes on."""


@dataclass
class Settings:
    """What the user chose on the command line; max_tokens None = until the reply ends or the context is full."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int | None = None


@dataclass
class ReplyStats:
    prompt_tokens: int | None = None  # None: not known (a stopped HTTP reply gets no usage chunk)
    completion_tokens: int = 0
    finish_reason: str | None = None
    seconds: float = 0.0  # first piece to last

    def describe(self) -> str:
        rate = (self.completion_tokens - 1) / self.seconds if self.completion_tokens > 1 and self.seconds > 0 else 0.0
        prompt = "?" if self.prompt_tokens is None else self.prompt_tokens
        return (f"[{prompt} prompt tokens, {self.completion_tokens} generated at {rate:.1f} tok/s, "
                f"finish: {self.finish_reason}]")


class EngineReply:
    """One reply from the in-process engine. interrupt() (from the SIGINT handler) aborts the
    request; the iteration then ends by itself with the engine's abort delta."""

    def __init__(self, engine, rid: str, prompt_ids: list[int], params):
        self.engine, self.rid = engine, rid
        self.stats = ReplyStats(prompt_tokens=len(prompt_ids))
        self.stream = engine.add_request(prompt_ids, params, request_id=rid)

    def __iter__(self):
        t_first = None
        for d in self.stream:
            if d.finish_reason == "error":
                raise ChatError(f"generation failed: {d.error}")
            if d.token_id is not None and t_first is None:
                t_first = time.perf_counter()
            self.stats.completion_tokens = d.num_output_tokens
            self.stats.finish_reason = d.finish_reason
            if t_first is not None:
                self.stats.seconds = time.perf_counter() - t_first
            if d.text:
                yield d.text

    def interrupt(self) -> None:
        self.engine.abort(self.rid)

    def close(self) -> None:
        if not self.stream.finished:
            self.engine.abort(self.rid)


class EngineBackend:
    """A loaded model (edged.loader.LoadedModel) and its own engine, one request at a time."""

    def __init__(self, lm, ctx: int):
        from edged.engine.engine import Engine, EngineConfig
        from edged.engine.sizing import plan_kv

        self.lm = lm
        self.name = lm.path.name
        kv = plan_kv(lm.model, 16, ctx=ctx, max_seqs=1, max_batch_tokens=512)
        self.engine = Engine(lm.model, lm.tokenizer, EngineConfig.from_plan(kv, max_batch_tokens=512, max_seqs=1))
        self.engine.start()
        self._ids = itertools.count()

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        text = self.lm.chat.render(messages, add_generation_prompt=True)
        return self.lm.tokenizer.encode(text, add_special=True, parse_special=True)

    def reply(self, messages: list[dict], settings: Settings) -> EngineReply:
        from edged.sampling import SamplingParams

        try:
            ids = self.prompt_ids(messages)
        except ValueError as e:  # ChatTemplateError
            raise ChatError(str(e)) from None
        room = self.engine.max_len - len(ids)
        if room < 1:
            raise ChatError(f"the conversation ({len(ids)} tokens) no longer fits the context "
                            f"({self.engine.max_len} tokens); /clear starts over")
        max_tokens = room if settings.max_tokens is None else min(settings.max_tokens, room)
        params = SamplingParams(temperature=settings.temperature, top_k=settings.top_k, top_p=settings.top_p,
                                min_p=settings.min_p, seed=settings.seed, max_tokens=max_tokens)
        try:
            return EngineReply(self.engine, f"chat-{next(self._ids)}", ids, params)
        except ValueError as e:  # admission: too long for the KV pool
            raise ChatError(str(e)) from None

    def close(self) -> None:
        self.engine.stop()


class HTTPReply:
    """One streamed /v1/chat/completions reply. interrupt() raises KeyboardInterrupt out of the
    blocking socket read; the chat then closes the response, which makes the server abort it."""

    def __init__(self, response):
        self.response = response
        self.stats = ReplyStats()

    def __iter__(self):
        t_first = None
        for line in self.response.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if "error" in chunk:
                raise ChatError(f"server error: {chunk['error'].get('message')}")
            if chunk.get("usage"):
                self.stats.prompt_tokens = chunk["usage"].get("prompt_tokens", 0)
                self.stats.completion_tokens = chunk["usage"].get("completion_tokens", 0)
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content")
                if choice.get("finish_reason"):
                    self.stats.finish_reason = choice["finish_reason"]
                if text:
                    self.stats.completion_tokens += 1  # a token a chunk, until the usage chunk says
                    t_first = t_first or time.perf_counter()
                    self.stats.seconds = time.perf_counter() - t_first
                    yield text

    def interrupt(self) -> None:
        self.stats.finish_reason = "abort"
        raise KeyboardInterrupt

    def close(self) -> None:
        self.response.close()


class HTTPBackend:
    """A running server at `url` (with or without the /v1 suffix), spoken to with streaming chat
    completions; `model` None = the first model the server lists."""

    def __init__(self, url: str, api_key: str | None, model: str | None, timeout: float = 600.0):
        import httpx

        base = url.rstrip("/")
        self.base = base[: -len("/v1")] if base.endswith("/v1") else base
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))
        self._httpx = httpx
        # a MODEL the server does not know fails at the first message, with the server's own 404
        self.name = model or self._served_models()[0]

    def _served_models(self) -> list[str]:
        try:
            r = self.client.get(f"{self.base}/v1/models")
        except self._httpx.HTTPError as e:
            raise ChatError(f"cannot reach {self.base}: {e}") from None
        if r.status_code != 200:
            raise ChatError(f"{self.base}/v1/models answered {r.status_code}: {_error_message(r.text)}")
        try:
            served = [m["id"] for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise ChatError(f"{self.base}/v1/models did not answer with an OpenAI model list") from None
        if not served:
            raise ChatError(f"{self.base} serves no model")
        return served

    def reply(self, messages: list[dict], settings: Settings) -> HTTPReply:
        body = {"model": self.name, "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}, "temperature": settings.temperature,
                "top_p": settings.top_p, "top_k": settings.top_k, "min_p": settings.min_p}
        if settings.max_tokens is not None:
            body["max_tokens"] = settings.max_tokens
        if settings.seed is not None:
            body["seed"] = settings.seed
        request = self.client.build_request("POST", f"{self.base}/v1/chat/completions", json=body)
        try:
            response = self.client.send(request, stream=True)
        except self._httpx.HTTPError as e:
            raise ChatError(f"cannot reach {self.base}: {e}") from None
        if response.status_code != 200:
            text = response.read().decode(errors="replace")
            response.close()
            raise ChatError(f"server answered {response.status_code}: {_error_message(text)}")
        return HTTPReply(response)

    def close(self) -> None:
        self.client.close()


def _error_message(text: str) -> str:
    """The message of an OpenAI error body, else the body itself (shortened)."""
    try:
        return str(json.loads(text)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return text[:300]
