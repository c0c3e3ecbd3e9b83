"""Store names and manifest parsing: what counts as a name, what a manifest must hold."""

import json

import pytest

from edged.store import Manifest, StoreError, full_name, is_store_name, split_name


@pytest.mark.parametrize("text", ["smollm2-135m-instruct", "gemma3-270m:latest", "SmolLM2:Q4_1", "a.b_c-d:v1.2"])
def test_store_names(text):
    assert is_store_name(text)


@pytest.mark.parametrize("text", ["models/x", "./x", "x.gguf", "X.GGUF", "", ":latest", "a:b:c", "-a", "a b",
                                  "~/m", "/abs/m"])
def test_not_store_names(text):
    assert not is_store_name(text)
    with pytest.raises(StoreError, match="not a model name"):
        split_name(text)


def test_names_are_case_insensitive_with_latest_default():
    assert split_name("SmolLM2-135M") == ("smollm2-135m", "latest")
    assert full_name("Gemma3:Q4") == "gemma3:q4"


def _manifest(**over):
    d = {"name": "m:latest", "files": [{"name": "m.gguf", "sha256": "ab" * 32, "size": 10}], "size": 10,
         "architecture": "llama", "parameters": 5, "tensor_types": {"Q4_K": 3, "F32": 4, "Q6_K": 1},
         "context_length": 128, "chat_template": True, "source": {"kind": "import", "path": "/x"},
         "created": "2025-01-01T00:00:00Z"}
    d.update(over)
    return d


def test_manifest_round_trip_and_quantization():
    m = Manifest.from_dict(_manifest())
    assert Manifest.from_json(m.to_json()) == m
    assert m.to_dict()["files"] == [{"name": "m.gguf", "sha256": "ab" * 32, "size": 10}]
    assert m.file_type == "" and m.quantization == "Q4_K"  # the most used type apart from F32 norms
    assert Manifest.from_dict(_manifest(file_type="Q4_K_M")).quantization == "Q4_K_M"  # the file's own word
    assert json.loads(m.to_json())["format"] == 1


@pytest.mark.parametrize("over, field", [
    ({"files": []}, "files"),
    ({"files": [{"name": "../escape.gguf", "sha256": "ab" * 32, "size": 1}]}, "files[0]"),
    ({"files": [{"name": "m.gguf", "sha256": "xyz", "size": 1}]}, "files[0]"),
    ({"size": "10"}, "'size'"),
    ({"parameters": True}, "'parameters'"),
    ({"tensor_types": {"Q4_K": "3"}}, "tensor_types"),
    ({"format": 99}, "format 99"),
])
def test_bad_manifests_name_the_field(over, field):
    with pytest.raises(StoreError) as ei:
        Manifest.from_dict(_manifest(**over), where="x.json")
    assert "x.json" in str(ei.value) and field in str(ei.value)


def test_unknown_keys_of_newer_writers_survive_a_rewrite():
    m = Manifest.from_dict(_manifest(digest_algo="sha256"))
    assert json.loads(m.to_json())["digest_algo"] == "sha256"
