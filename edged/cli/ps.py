"""`edged ps [--url URL]`: the models a running `edged serve` has loaded, as `ollama ps` shows
them (NAME, SIZE, PROCESSOR, CONTEXT, UNTIL), read from its GET /api/ps."""

from __future__ import annotations

import datetime
import json

import click

DEFAULT_URL = "http://127.0.0.1:8080"
FOREVER_YEARS = 20  # an expiry further away than this reads "Forever", as ollama ps


def human_bytes(n: int) -> str:
    """Ollama's sizes: decimal units, whole numbers from 10 up ("291 MB", "1.5 GB")."""
    for scale, unit in ((1e12, "TB"), (1e9, "GB"), (1e6, "MB"), (1e3, "KB")):
        if n >= scale:
            v = n / scale
            return f"{int(v)} {unit}" if v >= 10 or v == int(v) else f"{v:.1f} {unit}"
    return f"{n} B"


def processor(size: int, size_vram: int) -> str:
    if size_vram == 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = round((size - size_vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def human_duration(seconds: float) -> str:
    """Ollama's wording for a time span."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s < 60:
        return "1 second" if s == 1 else f"{s} seconds"
    minutes = s // 60
    if minutes < 60:
        return "About a minute" if minutes == 1 else f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 14:
        return f"{hours // 24} days"
    if hours < 24 * 60:
        return f"{hours // (24 * 7)} weeks"
    if hours < 24 * 730:
        return f"{hours // (24 * 30)} months"
    return f"{int(seconds // (86400 * 365))} years"


def until(expires_at: str | None, now: datetime.datetime | None = None) -> str:
    if not expires_at:
        return "Never"
    now = now or datetime.datetime.now(datetime.timezone.utc)
    t = datetime.datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    delta = (t - now).total_seconds()
    if delta > FOREVER_YEARS * 365 * 86400:
        return "Forever"
    if delta < 0:
        return "Stopping..."
    return f"{human_duration(delta)} from now"


def table(models: list[dict], now: datetime.datetime | None = None) -> str:
    rows = [("NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL")]
    for m in models:
        size, vram = int(m.get("size") or 0), int(m.get("size_vram") or 0)
        rows.append((m.get("name") or m.get("model", "?"), human_bytes(size), processor(size, vram),
                     str(m.get("context_length", "")), until(m.get("expires_at"), now)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("    ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)


@click.command("ps")
@click.option("--url", default=DEFAULT_URL, show_default=True,
              help="The running `edged serve` (its base URL).")
@click.option("--api-key", envvar="EDGED_API_KEY", default=None, help="Bearer key, if the server needs one.")
@click.option("--json", "as_json", is_flag=True, help="Print the server's /api/ps JSON.")
def command(url: str, api_key: str | None, as_json: bool) -> None:
    """Show the models a running `edged serve` has loaded: memory, CPU/GPU, context, expiry."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    endpoint = url.rstrip("/") + "/api/ps"
    try:
        r = httpx.get(endpoint, headers=headers, timeout=10)
    except httpx.HTTPError as e:
        raise click.ClickException(f"no edged server answers at {url} ({type(e).__name__}: {e}); "
                                   "start one with `edged serve`, or give its address with --url") from None
    if r.status_code != 200:
        raise click.ClickException(f"{endpoint} answered {r.status_code}: {_error_text(r)}")
    try:
        models = r.json()["models"]
    except (ValueError, KeyError, TypeError):
        raise click.ClickException(f"{endpoint} did not answer with Ollama's /api/ps JSON; is it "
                                   "an edged server?") from None
    click.echo(json.dumps(r.json()) if as_json else table(models))


def _error_text(r) -> str:
    try:
        err = r.json().get("error")
    except ValueError:
        return r.text[:200]
    return err.get("message", str(err)) if isinstance(err, dict) else str(err)
