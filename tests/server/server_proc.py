"""Start a real `edged serve` subprocess on a free loopback port and wait until /health says ok."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """One `edged serve` child; its stderr/stdout go to `log_path` (shown when start fails)."""

    def __init__(self, args: list[str], log_path: Path, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log_path = log_path
        cmd = [sys.executable, "-c", "from edged.cli import main; main()", "serve",
               "--port", str(self.port), *args]
        if api_key:
            cmd += ["--api-key", api_key]
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1"})

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def log_tail(self, n: int = 4000) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-n:]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"edged serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"edged serve not ready after {timeout} s:\n{self.log_tail()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        return self.proc.returncode

    def metrics(self) -> dict[str, float]:
        """Unlabelled samples of /metrics as name -> value; the per-model engine series (only a
        `model` label) summed over the loaded models."""
        text = httpx.get(f"{self.url}/metrics", headers=self.headers, timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            series, value = line.rsplit(" ", 1)
            name, _, labels = series.partition("{")
            if not labels:
                out[name] = float(value)
            elif re.fullmatch(r'model="[^"]*"\}', labels):
                out[name] = out.get(name, 0.0) + float(value)
        return out


@contextmanager
def running_server(args: list[str], log_path: Path, api_key: str | None = None):
    """A started `edged serve ARGS`, stopped on exit; a cold JIT cache compiles every kernel first
    (minutes on 2 busy cores), hence EDGED_TEST_SERVE_TIMEOUT."""
    proc = ServerProcess(args, log_path, api_key=api_key)
    try:
        proc.wait_ready(float(os.environ.get("EDGED_TEST_SERVE_TIMEOUT", "900")))
        yield proc
    finally:
        proc.stop()
