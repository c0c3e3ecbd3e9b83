"""`edged chat` end to end on a tiny random model: history, /clear, /system, multi-line messages,
Ctrl-C (SIGINT) stopping a reply while the chat goes on, in process and against `edged serve --url`.

The chat is driven as a script drives it: stdin piped (plain lines, no prompts). With --verbose each
reply is followed by a stats line on stderr; merged into stdout, the output splits into the replies
and their prompt token counts, which the tests recompute with the model's own template and tokenizer.
"""

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from edged.cli import main
from tests.helpers.tiny_models import write_tiny_model
from tests.server.server_proc import running_server

pytestmark = pytest.mark.e2e

STATS = re.compile(r"\[(\d+|\?) prompt tokens, (\d+) generated at [\d.]+ tok/s, finish: (\w+)\]\n")
CTX = 8192


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # qwen2: byte-level BPE with <|im_start|>/<|im_end|> specials, so the ChatML fallback is real
    return str(write_tiny_model(tmp_path_factory.mktemp("chat") / "tiny-chat.gguf", "qwen2", context=CTX))


@pytest.fixture(scope="module")
def local(tiny):
    """The tiny model's template and tokenizer, to count prompt tokens independently."""
    from edged.chat import ChatTemplate
    from edged.quant import load_gguf
    from edged.tokenizer import Tokenizer

    gf = load_gguf(tiny)
    tok, chat = Tokenizer.from_gguf(gf), ChatTemplate.from_gguf(gf)
    return lambda messages: len(tok.encode(chat.render(messages), add_special=True, parse_special=True))


# SIGINT as a shell leaves it (Python's KeyboardInterrupt handler, not blocked): an ignored SIGINT is
# inherited across exec, and Python then installs no handler of its own, so a disposition left behind
# by an earlier test in this process would make the chat deaf to Ctrl-C
_CHAT_MAIN = ("import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
              "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); from edged.cli import main; main()")


def _chat(args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _CHAT_MAIN, "chat", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONIOENCODING": "utf-8"})


def _exit_status(proc, timeout: float) -> int:
    """proc's exit status within timeout; else it is killed and the failure shows its last output
    and this process's SIGINT state (what the child inherited)."""
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.stdout.read()[-2000:]
        blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        raise AssertionError(f"the chat did not exit within {timeout} s (parent SIGINT handler "
                             f"{signal.getsignal(signal.SIGINT)!r}, blocked {blocked}); its last output: {out!r}") from None


def _turns(output: str) -> list[tuple[str, int | None, int, str]]:
    """(reply text, prompt tokens, generated tokens, finish) per reply in the merged output."""
    out, start = [], 0
    for m in STATS.finditer(output):
        chunk = output[start:m.start()].removesuffix("(reply stopped)\n")
        # the reply follows the last line the chat itself wrote before it (or the start)
        for marker in ("kernels ready in", "Set the system message.", "Cleared the conversation."):
            i = chunk.rfind(marker)
            if i >= 0:
                chunk = chunk[chunk.index("\n", i) + 1:]
        reply = chunk.removesuffix("\n")
        prompt = None if m.group(1) == "?" else int(m.group(1))
        out.append((reply, prompt, int(m.group(2)), m.group(3)))
        start = m.end()
    return out


def test_history_clear_system_and_multiline(tiny, local):
    script = ('What is the capital of France?\n'
              '"""\nline one\nline two\n"""\n'
              '/clear\n'
              'What is the capital of France?\n'
              '/system You are terse.\n'
              'What is the capital of France?\n'
              '/bye\n'
              'this line is never read\n')
    proc = _chat([tiny, "--temperature", "0", "--max-tokens", "8", "--verbose", "--ctx", "1024"])
    out, _ = proc.communicate(script.encode(), timeout=300)
    text = out.decode("utf-8")
    assert proc.returncode == 0, text
    turns = _turns(text)
    assert len(turns) == 4, text  # the line after /bye got no reply
    (a1, p1, _, _), (a2, p2, _, _), (a3, p3, _, _), (a4, p4, _, _) = turns
    q = "What is the capital of France?"
    user = lambda t: {"role": "user", "content": t}  # noqa: E731
    bot = lambda t: {"role": "assistant", "content": t}  # noqa: E731
    assert p1 == local([user(q)])
    # the second prompt holds the first turn, and the block between the \"\"\" lines is one message
    assert p2 == local([user(q), bot(a1), user("line one\nline two")])
    assert p3 == p1 and a3 == a1  # /clear: the same question starts afresh
    assert p4 == local([{"role": "system", "content": "You are terse."}, user(q), bot(a3), user(q)])
    assert "Cleared the conversation." in text and "Set the system message." in text


def test_prompt_text_holds_the_history(tiny, monkeypatch):
    """What the engine is given (in process, through CliRunner): the rendered history, as text."""
    from edged.engine.engine import Engine

    prompts = []
    real = Engine.add_request

    def recording(self, prompt_ids, params, *args, **kwargs):
        prompts.append((self.tokenizer.decode(list(prompt_ids), skip_special=False), params.max_tokens))
        return real(self, prompt_ids, params, *args, **kwargs)

    monkeypatch.setattr(Engine, "add_request", recording)
    r = CliRunner().invoke(main, ["chat", tiny, "--temperature", "0", "--max-tokens", "6", "--ctx", "512",
                                  "--system", "Be brief."],
                           input='first question\n"""second\nquestion"""\n')
    assert r.exit_code == 0, r.output
    assert len(prompts) == 2
    first, second = prompts[0][0], prompts[1][0]
    assert "<|im_start|>system\nBe brief.<|im_end|>" in first
    assert first.endswith("<|im_start|>user\nfirst question<|im_end|>\n<|im_start|>assistant\n")
    assert second.startswith(first)
    reply, _, rest = second[len(first):].partition("<|im_end|>")
    assert r.stdout.startswith(reply + "\n")  # the reply as shown is the reply in the history
    assert rest == "\n<|im_start|>user\nsecond\nquestion<|im_end|>\n<|im_start|>assistant\n"
    assert [mt for _, mt in prompts] == [6, 6]


def test_max_tokens_default_is_the_rest_of_the_context(tiny, monkeypatch):
    from edged.engine.engine import Engine

    seen = []
    real = Engine.add_request

    def recording(self, ids, params, *args, **kwargs):
        seen.append((len(ids), params.max_tokens, self.max_len))
        return real(self, ids, params, *args, **kwargs)

    monkeypatch.setattr(Engine, "add_request", recording)
    r = CliRunner().invoke(main, ["chat", tiny, "--ctx", "64", "--seed", "3"], input="hi\n")
    assert r.exit_code == 0, r.output
    (n_prompt, max_tokens, max_len), = seen
    assert max_tokens == max_len - n_prompt and max_len <= 64


def _read_until(proc, needle: bytes, timeout: float) -> bytes:
    """Output read so far, once it contains needle (os.read: no buffering past what arrived)."""
    buf, deadline = b"", time.monotonic() + timeout
    fd = proc.stdout.fileno()
    while needle not in buf:
        assert time.monotonic() < deadline, f"no {needle!r} in {buf[-2000:]!r}"
        chunk = os.read(fd, 65536)
        assert chunk, f"the chat ended early: {buf[-2000:]!r}"
        buf += chunk
    return buf


def test_sigint_stops_the_reply_not_the_chat(tiny):
    n = 3000  # a long reply: ~2 s on the tiny model, so SIGINT lands inside it
    proc = _chat([tiny, "--temperature", "0", "--max-tokens", str(n), "--ctx", str(CTX), "--verbose"])
    try:
        proc.stdin.write(b"Write for a long time.\n")
        proc.stdin.flush()
        head = _read_until(proc, b"kernels ready in", 300)
        while not head.partition(b"kernels ready in")[2].partition(b"\n")[2]:  # the reply has started
            head += os.read(proc.stdout.fileno(), 65536)
        proc.send_signal(signal.SIGINT)
        head += _read_until(proc, b"(reply stopped)", 60)
        proc.stdin.write(b"And now?\n/bye\n")
        proc.stdin.flush()
        rest, _ = proc.communicate(timeout=300)
    finally:
        proc.kill()
    text = (head + rest).decode("utf-8")
    assert proc.returncode == 0, text
    (a1, p1, g1, f1), (a2, p2, g2, f2) = _turns(text)
    assert f1 == "abort" and 0 < g1 < n
    assert f2 == "length" and g2 == n  # the next line got a whole reply
    assert p2 > p1 + len(a1) // 8  # and the stopped reply stayed in the history


def test_sigint_or_eof_at_the_prompt_leaves(tiny):
    proc = _chat([tiny])
    proc.stdin.write(b"/help\n")
    proc.stdin.flush()
    _read_until(proc, b"Available commands", 300)
    proc.send_signal(signal.SIGINT)
    assert _exit_status(proc, 60) == 0
    proc.stdout.close()
    proc.stdin.close()
    r = CliRunner().invoke(main, ["chat", tiny], input="")
    assert r.exit_code == 0 and r.stdout == ""


def test_context_full_is_an_error_and_the_chat_goes_on(tiny):
    long = " ".join(["capital"] * 100)
    r = CliRunner().invoke(main, ["chat", tiny, "--ctx", "32", "--max-tokens", "4"], input=f"{long}\nhi\n")
    assert r.exit_code == 1  # from a pipe, a failed turn makes the exit status non-zero
    assert "no longer fits the context" in r.stderr
    assert r.stdout.strip()  # "hi" was still answered


def test_bad_options_and_models(tiny, tmp_path):
    r = CliRunner().invoke(main, ["chat", "no-such-model"], input="")
    assert r.exit_code == 2 and "no-such-model:latest is not in the store" in r.output
    r = CliRunner().invoke(main, ["chat", str(tmp_path / "missing.gguf")], input="")
    assert r.exit_code == 2 and "does not exist" in r.output
    r = CliRunner().invoke(main, ["chat", tiny, "--top-p", "2"], input="")
    assert r.exit_code == 2 and "top_p" in r.output
    r = CliRunner().invoke(main, ["chat", "--url", "ftp://x"], input="")
    assert r.exit_code == 2 and "--url" in r.output
    r = CliRunner().invoke(main, ["chat", "--url", "http://127.0.0.1:9"], input="")  # nothing listens
    assert r.exit_code == 1 and "cannot reach http://127.0.0.1:9" in r.output


def test_url_backend(tiny, tmp_path):
    with running_server([tiny, "--ctx", "4096", "--log-level", "warning"], tmp_path / "serve.log",
                        api_key="k") as server:
        # history and /clear, over streamed /v1/chat/completions (usage gives the prompt tokens)
        proc = _chat(["--url", f"{server.url}/v1", "--api-key", "k", "--temperature", "0",
                      "--max-tokens", "6", "--verbose"])
        out, _ = proc.communicate(b"first\nsecond\n/clear\nfirst\n", timeout=300)
        text = out.decode("utf-8")
        assert proc.returncode == 0, text
        (a1, p1, g1, _), (_, p2, _, _), (a3, p3, _, _) = _turns(text)
        assert g1 == 6 and p2 > p1 + 6 and (p3, a3) == (p1, a1)

        # SIGINT closes the stream: the server aborts the request and the chat answers the next line
        before = _aborted(server)
        proc = _chat(["--url", server.url, "--api-key", "k", "--temperature", "0", "--max-tokens", "3000",
                      "--verbose"])
        try:
            proc.stdin.write(b"Write for a long time.\n")
            proc.stdin.flush()
            head = os.read(proc.stdout.fileno(), 65536)
            deadline = time.monotonic() + 60  # interrupt the reply, not the request before it arrives
            while _metric(server, "edged_requests_running") < 1:
                assert time.monotonic() < deadline, "the reply never started"
                time.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            head += _read_until(proc, b"(reply stopped)", 60)
            rest, _ = proc.communicate(b"short\n", timeout=300)
        finally:
            proc.kill()
        text = (head + rest).decode("utf-8")
        assert proc.returncode == 0, text
        (*_, f1), (*_, f2) = _turns(text)
        assert f1 == "abort" and f2 in ("length", "stop")  # the history now varies: EOS may come first
        deadline = time.monotonic() + 30
        while _aborted(server) <= before:
            assert time.monotonic() < deadline, ("the server never aborted the stopped reply: "
                                                 + repr(_finished(server)))
            time.sleep(0.2)

        # a model the server does not serve: its 404, and a failing exit status
        r = CliRunner().invoke(main, ["chat", "--url", server.url, "--api-key", "k", "nope"], input="hi\n")
        assert r.exit_code == 1 and "404" in r.stderr and "nope" in r.stderr
        r = CliRunner().invoke(main, ["chat", "--url", server.url], input="hi\n")  # no key
        assert r.exit_code == 1 and "401" in r.output


def _metrics_text(server) -> str:
    import httpx

    return httpx.get(f"{server.url}/metrics", headers=server.headers, timeout=10).text


def _metric(server, pattern: str) -> float:
    """The first /metrics sample whose name and labels match `pattern` (a regex); 0 if none."""
    m = re.search(pattern + r"(?:\{[^}]*\})? ([\d.e+-]+)\n", _metrics_text(server))
    return float(m.group(1)) if m else 0.0


def _finished(server) -> list:
    """Every finish-reason counter of /metrics, for a failure message."""
    return re.findall(r'edged_requests_finished_total\{[^}]*\} [\d.e+-]+', _metrics_text(server))


def _aborted(server) -> float:
    return _metric(server, r'edged_requests_finished_total\{finish_reason="abort"\}')
