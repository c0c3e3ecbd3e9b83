"""The `edged chat` loop, as `ollama run`: read a message (multi-line between \"\"\"), run a slash
command or stream the reply, keep the history. Ctrl-C stops a reply and the chat goes on; Ctrl-C or
Ctrl-D at an empty prompt leaves. From a pipe it reads plain lines and prints no prompts."""

from __future__ import annotations

import signal
import sys
import threading

from edged.cli.chat_backends import ChatError, Settings

HELP = """Available commands:
  /system TEXT   set the system message (/system alone shows it)
  /clear         forget the conversation (the system message stays)
  /bye           leave
  /? or /help    this help
Begin and end a multi-line message with \"\"\".
Ctrl-C stops a reply; Ctrl-C or Ctrl-D at an empty prompt leaves."""

QUOTES = '"""'


class LineReader:
    """Messages from a terminal (readline editing and history, >>> and ... prompts) or from a pipe."""

    def __init__(self, stream=None, interactive: bool | None = None):
        self.stream = stream or sys.stdin
        self.typed = ""  # the half-typed line when Ctrl-C interrupted input()
        self.interactive = self.stream.isatty() if interactive is None else interactive
        if self.interactive:
            try:
                import readline  # noqa: F401  (gives input() line editing and history)
            except ImportError:
                pass

    def _line(self, prompt: str) -> str | None:
        """One line without its newline; None at end of input."""
        if self.interactive:
            self.typed = ""
            previous = _set_sigint(self._on_sigint)
            try:
                return input(prompt)
            except EOFError:
                return None
            finally:
                _set_sigint(previous)
        line = self.stream.readline()
        return None if not line else line.rstrip("\r\n")

    def read(self) -> tuple[str, str]:
        """The next (kind, text): kind "message", "command" (a single line starting with /),
        "none" (nothing to do: an empty line, a cancelled line or block) or "leave"."""
        try:
            line = self._line(">>> ")
        except KeyboardInterrupt:
            if self.interactive and self.typed:
                print()  # Ctrl-C on a half-typed line drops that line, as a shell does
                return "none", ""
            return "leave", ""
        if line is None:
            return "leave", ""
        if line.lstrip().startswith(QUOTES):
            try:
                return "message", self._block(line.lstrip()[len(QUOTES):])
            except KeyboardInterrupt:
                print()
                return "none", ""
        if line.startswith("/"):
            return "command", line
        return ("message", line) if line.strip() else ("none", "")

    def _block(self, first: str) -> str:
        """A multi-line message: the text after the opening \"\"\" up to the closing one."""
        if first.rstrip().endswith(QUOTES):  # \"\"\"one line\"\"\"
            return first.rstrip()[: -len(QUOTES)]
        lines = [first] if first else []
        while True:
            line = self._line("... ")
            if line is None:  # end of input closes the block
                return "\n".join(lines)
            if line.rstrip().endswith(QUOTES):
                tail = line.rstrip()[: -len(QUOTES)]
                if tail:
                    lines.append(tail)
                return "\n".join(lines)
            lines.append(line)


    def _on_sigint(self, signum, frame):
        # readline clears its buffer once the interrupt leaves input(): look at it before
        self.typed = _line_buffer()
        raise KeyboardInterrupt


def _line_buffer() -> str:
    try:
        import readline
    except ImportError:
        return ""
    return readline.get_line_buffer()


class ChatSession:
    """The conversation: the system message, the history and the commands that change them."""

    def __init__(self, backend, settings: Settings, system: str | None = None, out=None, err=None,
                 verbose: bool = False, interactive: bool = False):
        self.backend = backend
        self.settings = settings
        self.system = system
        self.history: list[dict] = []
        self.out = out or sys.stdout
        self.err = err or sys.stderr
        self.verbose = verbose
        self.interactive = interactive
        self.failed_turns = 0

    def messages(self) -> list[dict]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    def run(self, reader: LineReader) -> None:
        try:
            while True:
                kind, text = reader.read()
                if kind == "leave" or (kind == "command" and not self.command(text)):
                    return
                if kind == "message":
                    self.ask(text)
        except KeyboardInterrupt:  # Ctrl-C outside a reply and outside the prompt (a note printing)
            return

    def command(self, line: str) -> bool:
        """Run one slash command; False means leave."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if name in ("/bye", "/exit"):
            return False
        if name == "/clear":
            self.history.clear()
            self._note("Cleared the conversation.")
        elif name == "/system":
            if arg:
                self.system = arg
                self._note("Set the system message.")
            else:
                self._note(f"System message: {self.system!r}" if self.system else "No system message.")
        elif name in ("/?", "/help"):
            self._note(HELP)
        else:
            self._note(f"Unknown command '{name}'. Type /? for help.")
        return True

    def ask(self, text: str) -> None:
        """Stream the reply to `text`; it joins the history with what was shown (also when stopped)."""
        self.history.append({"role": "user", "content": text})
        reply, pieces, stopped, error = None, [], False, None

        def on_sigint(signum, frame):
            if reply is None:  # still preparing (rendering, connecting): leave that step
                raise KeyboardInterrupt
            reply.interrupt()  # the engine aborts; the HTTP reply raises out of its read

        previous = _set_sigint(on_sigint)
        try:
            reply = self.backend.reply(self.messages(), self.settings)
            for piece in reply:
                self.out.write(piece)
                self.out.flush()
                pieces.append(piece)
        except KeyboardInterrupt:
            stopped = True
        except ChatError as e:
            error = e
        finally:
            _set_sigint(previous)
            if reply is not None:
                reply.close()
        stopped = stopped or (reply is not None and reply.stats.finish_reason == "abort")
        if pieces:
            self.out.write("\n\n" if self.interactive else "\n")
            self.out.flush()
            self.history.append({"role": "assistant", "content": "".join(pieces)})
        else:
            self.history.pop()  # nothing was said: forget the question too
        if error is not None:
            self.failed_turns += 1
            self._note(f"error: {error}")
        elif stopped:
            self._note("(reply stopped)")
        if self.verbose and reply is not None:
            self._note(reply.stats.describe())

    def _note(self, text: str) -> None:
        print(text, file=self.err, flush=True)


def _set_sigint(handler):
    """Install a SIGINT handler (main thread only); returns the previous one, or None."""
    if handler is None or threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, handler)
