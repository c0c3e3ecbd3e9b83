"""`edged run`, `edged perplexity` and `edged bench` end to end on a tiny random model."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from edged.cli import main
from tests.helpers.tiny_models import write_tiny_model

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return str(write_tiny_model(tmp_path_factory.mktemp("cli") / "g.gguf", "gemma3"))


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_run_prompt_ids_greedy_json(tiny):
    r = CliRunner().invoke(main, ["run", tiny, "--prompt-ids", "2,5,6,7", "--temperature", "0",
                                  "-n", "5", "--logprobs", "3", "--json"])
    out = _json(r)
    assert out["prompt_ids"] == [2, 5, 6, 7]
    assert out["finish_reason"] in ("length", "stop")
    assert 1 <= len(out["ids"]) <= 5
    assert all(len(step) == 3 for step in out["logprobs"])
    assert out["timings"]["generated_tokens"] >= len(out["ids"])
    # greedy: each generated id is the top-1 of its step
    assert [step[0][0] for step in out["logprobs"]][: len(out["ids"])] == out["ids"]
    again = _json(CliRunner().invoke(main, ["run", tiny, "--prompt-ids", "2,5,6,7", "--temperature",
                                            "0", "-n", "5", "--json"]))
    assert again["ids"] == out["ids"]


def test_run_text_prompt_streams_text(tiny):
    r = CliRunner().invoke(main, ["run", tiny, "--prompt", "hello world", "-n", "4", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert "generated at" in r.stderr


def test_run_needs_exactly_one_prompt(tiny):
    r = CliRunner().invoke(main, ["run", tiny])
    assert r.exit_code == 2 and "exactly one" in r.output
    r = CliRunner().invoke(main, ["run", tiny, "--prompt-ids", "2,x"])
    assert r.exit_code == 2


def test_run_rejects_out_of_vocab_ids(tiny):
    r = CliRunner().invoke(main, ["run", tiny, "--prompt-ids", "2,999999", "--json"])
    assert r.exit_code == 1 and "outside the vocabulary" in r.output


def test_perplexity_json(tiny, tmp_path):
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(0)
    text.write_text(" ".join("".join(rng.choice(list("abcdefgh"), 4)) for _ in range(200)))
    out = _json(CliRunner().invoke(main, ["perplexity", tiny, str(text), "--ctx", "32", "--json"]))
    assert out["chunks"] >= 2 and out["scored"] == out["chunks"] * 15
    assert 1.0 < out["ppl"] < 1e6


def test_perplexity_too_short_text_is_clear_error(tiny, tmp_path):
    text = tmp_path / "short.txt"
    text.write_text("hi")
    r = CliRunner().invoke(main, ["perplexity", tiny, str(text), "--ctx", "512"])
    assert r.exit_code == 1 and "need at least ctx" in r.output


def test_bench_single_stream_json(tiny):
    r = CliRunner().invoke(main, ["bench", tiny, "--prompt-tokens", "8", "--gen-tokens", "4",
                                  "--repeat", "2", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["single"]["decode"]["8"]["runs"] == 2
    assert out["single"]["prefill"]["8"]["median"] > 0


def test_kv_type_flag(tiny, tmp_path):
    """--kv-type reaches the cache (f16 unless given); the perplexity moves by its rounding only."""
    text = tmp_path / "t.txt"
    rng = np.random.default_rng(1)
    text.write_text(" ".join("".join(rng.choice(list("abcdefgh"), 4)) for _ in range(120)))
    args = ["perplexity", tiny, str(text), "--ctx", "32", "--json"]
    ppl = {t: _json(CliRunner().invoke(main, args + ["--kv-type", t])) for t in ("f32", "q8_0")}
    ppl["f16"] = _json(CliRunner().invoke(main, args))
    assert {t: r["kv_type"] for t, r in ppl.items()} == {"f32": "f32", "q8_0": "q8_0", "f16": "f16"}
    assert abs(ppl["f16"]["ppl"] / ppl["f32"]["ppl"] - 1) < 0.01
    assert abs(ppl["q8_0"]["ppl"] / ppl["f32"]["ppl"] - 1) < 0.05
    r = CliRunner().invoke(main, ["run", tiny, "--prompt-ids", "2,5", "--kv-type", "q4_0"])
    assert r.exit_code == 2 and "Invalid value for '--kv-type'" in r.output


def test_run_with_a_draft_model_gives_the_same_tokens(tiny, tmp_path):
    args = ["run", tiny, "--prompt-ids", "2,5,6,7", "--temperature", "0", "-n", "8", "--json"]
    plain = _json(CliRunner().invoke(main, args))
    drafted = _json(CliRunner().invoke(main, args + ["--draft", tiny, "--draft-p-min", "0"]))
    always = _json(CliRunner().invoke(main, args + ["--draft", tiny, "--spec-always"]))
    assert drafted["ids"] == plain["ids"] == always["ids"]
    r = CliRunner().invoke(main, args + ["--draft", tiny, "--spec", "ngram"])
    assert r.exit_code == 2 and "choose one" in r.output
    other = str(write_tiny_model(tmp_path / "q.gguf", "qwen2"))  # another vocabulary
    r = CliRunner().invoke(main, args + ["--draft", other])
    assert r.exit_code == 1 and "draft model" in r.output and "tokenizer" in r.output, r.output
