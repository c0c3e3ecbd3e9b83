"""Smoke test of `edged bench --embeddings` on a tiny model (speed itself is never asserted)."""

import json

import pytest
from click.testing import CliRunner

from edged.cli import main
from tests.helpers.tiny_models import write_tiny_model


@pytest.mark.e2e
def test_bench_embeddings_cli_json(tmp_path):
    path = write_tiny_model(tmp_path / "t.gguf", "gemma3", context=512)
    r = CliRunner().invoke(main, ["bench", str(path), "--embeddings", "--concurrency", "2,4",
                                  "--prompt-tokens", "24", "--repeat", "1", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout[r.stdout.index("{"):])
    rows = report["embeddings"]["levels"]
    assert [(x["concurrency"], x["input_tokens"], x["pooling"]) for x in rows] == [(2, 24, "mean"), (4, 24, "mean")]
    assert all(x["inputs_per_s"] > 0 and len(x["inputs_per_s_runs"]) == 1 for x in rows)
    assert set(report) == {"embeddings"}  # no other section ran
    bad = CliRunner().invoke(main, ["bench", str(path), "--embeddings", "--concurrency", "x"])
    assert bad.exit_code == 2 and "comma-separated integers" in bad.output
