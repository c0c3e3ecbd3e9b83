"""The malformed-request table shared by the in-process and the real-server tests.

Each case: (name, method, path, json body or raw bytes, expected status). Bodies are valid
except for the one thing the name says.
"""

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
MSG = [{"role": "user", "content": "hi"}]


def _chat(**kw):
    return {"messages": MSG, "max_tokens": 2, **kw}


def _comp(**kw):
    return {"prompt": "hi", "max_tokens": 2, **kw}


MALFORMED = [
    ("bad json", "POST", CHAT, b"{not json", 400),
    ("empty body", "POST", CHAT, b"", 400),
    ("invalid utf-8", "POST", CHAT, b'{"messages": "\xff\xfe"}', 400),
    ("body is an array", "POST", CHAT, [1, 2], 400),
    ("messages missing", "POST", CHAT, {"max_tokens": 2}, 400),
    ("messages empty", "POST", CHAT, _chat(messages=[]), 400),
    ("messages a string", "POST", CHAT, _chat(messages="hi"), 400),
    ("message without role", "POST", CHAT, _chat(messages=[{"content": "x"}]), 400),
    ("message role the API does not define", "POST", CHAT, _chat(messages=[{"role": "wizard", "content": "x"}]), 400),
    ("message content a number", "POST", CHAT, _chat(messages=[{"role": "user", "content": 5}]), 400),
    ("image content part", "POST", CHAT, _chat(messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), 400),
    ("max_tokens negative", "POST", CHAT, _chat(max_tokens=-1), 400),
    ("max_tokens zero", "POST", CHAT, _chat(max_tokens=0), 400),
    ("max_tokens a string", "POST", CHAT, _chat(max_tokens="10"), 400),
    ("max_tokens a boolean", "POST", CHAT, _chat(max_tokens=True), 400),
    ("max_tokens huge", "POST", CHAT, _chat(max_tokens=10**9), 400),
    ("max_completion_tokens fractional", "POST", CHAT, _chat(max_completion_tokens=2.5), 400),
    ("n zero", "POST", CHAT, _chat(n=0), 400),
    ("n nine", "POST", CHAT, _chat(n=9), 400),
    ("n huge", "POST", CHAT, _chat(n=10**6), 400),
    ("top_logprobs 21", "POST", CHAT, _chat(logprobs=True, top_logprobs=21), 400),
    ("top_logprobs negative", "POST", CHAT, _chat(logprobs=True, top_logprobs=-1), 400),
    ("top_logprobs without logprobs", "POST", CHAT, _chat(top_logprobs=3), 400),
    ("logprobs a string", "POST", CHAT, _chat(logprobs="yes"), 400),
    ("temperature negative", "POST", CHAT, _chat(temperature=-0.5), 400),
    ("temperature a string", "POST", CHAT, _chat(temperature="hot"), 400),
    ("top_p zero", "POST", CHAT, _chat(top_p=0), 400),
    ("top_p above one", "POST", CHAT, _chat(top_p=1.5), 400),
    ("min_p above one", "POST", CHAT, _chat(min_p=2), 400),
    ("top_k below -1", "POST", CHAT, _chat(top_k=-5), 400),
    ("five stop strings", "POST", CHAT, _chat(stop=["a", "b", "c", "d", "e"]), 400),
    ("stop a number", "POST", CHAT, _chat(stop=123), 400),
    ("stop empty string", "POST", CHAT, _chat(stop=[""]), 400),
    ("seed a string", "POST", CHAT, _chat(seed="abc"), 400),
    ("logit_bias id outside vocab", "POST", CHAT, _chat(logit_bias={"999999999": 1}), 400),
    ("logit_bias value too big", "POST", CHAT, _chat(logit_bias={"5": 1000}), 400),
    ("logit_bias not a map", "POST", CHAT, _chat(logit_bias=[1, 2]), 400),
    ("stream a string", "POST", CHAT, _chat(stream="yes"), 400),
    ("stream_options without stream", "POST", CHAT, _chat(stream_options={"include_usage": True}), 400),
    ("presence_penalty 3", "POST", CHAT, _chat(presence_penalty=3), 400),
    ("frequency_penalty nan-like", "POST", CHAT, b'{"messages": [{"role": "user", "content": "x"}], '
                                                 b'"frequency_penalty": NaN}', 400),
    ("repetition_penalty zero", "POST", CHAT, _chat(repetition_penalty=0), 400),
    ("bad response_format type", "POST", CHAT, _chat(response_format={"type": "xml"}), 400),
    ("unknown model", "POST", CHAT, _chat(model="gpt-4-nonexistent"), 404),
    ("user not a string", "POST", CHAT, _chat(user=7), 400),
    ("prompt missing", "POST", COMP, {"max_tokens": 2}, 400),
    ("prompt empty list", "POST", COMP, _comp(prompt=[]), 400),
    ("prompt token outside vocab", "POST", COMP, _comp(prompt=[1, 999999999]), 400),
    ("prompt negative token", "POST", COMP, _comp(prompt=[[1, 2], [-1]]), 400),
    ("prompt mixed list", "POST", COMP, _comp(prompt=[1, "a"]), 400),
    ("prompt a number", "POST", COMP, _comp(prompt=5), 400),
    ("prompt empty inner list", "POST", COMP, _comp(prompt=[[]]), 400),
    ("completion logprobs 21", "POST", COMP, _comp(logprobs=21), 400),
    ("prompt_logprobs streamed", "POST", COMP, _comp(prompt_logprobs=1, stream=True), 400),
    ("prompt_logprobs 21", "POST", CHAT, _chat(prompt_logprobs=21), 400),
    ("completion max_tokens negative", "POST", COMP, _comp(max_tokens=-1), 400),
    ("embeddings input missing", "POST", "/v1/embeddings", {"model": None}, 400),
    ("embeddings input empty string", "POST", "/v1/embeddings", {"input": ["a", ""]}, 400),
    ("embeddings encoding_format", "POST", "/v1/embeddings", {"input": "a", "encoding_format": "hex"}, 400),
    ("prompt longer than the context", "POST", COMP, _comp(prompt=[5] * 100000), 400),
    ("too many prompts x n", "POST", COMP, _comp(prompt=["a"] * 20, n=2), 400),
    ("suffix", "POST", COMP, _comp(suffix="x"), 400),
    ("tokenize content a number", "POST", "/tokenize", {"content": 5}, 400),
    ("detokenize negative id", "POST", "/detokenize", {"tokens": [-1]}, 400),
    ("unknown route", "GET", "/v1/nonexistent", None, 404),
    ("wrong method", "GET", CHAT, None, 405),
    ("unknown model id", "GET", "/v1/models/nope", None, 404),
]
