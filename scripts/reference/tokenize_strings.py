#!/usr/bin/env python3
"""Writes llama.cpp's token ids for fixed strings, the reference Ballast's tokenizer must match.

Loads the default real model's vocabulary with llama-cpp-python (vocab_only, no weights) and
records `tokenize(text.encode(), add_bos=False, special=True)` for each string below into
engine/tests/fixtures/smollm2_tokens.json, which the engine's tokenizer tests compare against
id for id (engine/src/compute/tokenizer/tests.rs).

    pip install llama-cpp-python==0.3.36          # builds llama.cpp from source
    scripts/fetch-model.sh                         # caches the GGUF file
    python3 scripts/reference/tokenize_strings.py [MODEL.gguf]

The model path defaults to the cache scripts/fetch-model.sh fills.
"""

import json
import os
import sys
from pathlib import Path

import llama_cpp

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Each string exercises a part of the pre-tokenizer or of special-token parsing. Keep the
# list stable: the tests require some of these kinds to be present.
CASES = [
    # Plain ASCII prose.
    "Hello, world! This is a simple ASCII sentence.",
    # Leading and trailing spaces.
    "  leading and trailing spaces  ",
    # Runs of whitespace: tabs, newlines, mixed, and a whitespace-only string.
    "tabs\tand\t\ttabs, newlines\n\nand  runs   of    spaces\n \t \n",
    "   ",
    "Windows\r\nline\r\nendings",
    # Digits: SmolLM2 splits every digit.
    "12345 3.14159 and 2024-01-15, 1,000,000",
    # Accents, precomposed and combining; a no-break space and a zero-width space.
    "Café, naïve, résumé, Ångström, São Paulo; e\u0301 vs \u00e9, no\u00a0break, zero\u200bwidth",
    # CJK and Korean.
    "中文字符和日本語のテキスト、한국어도",
    # Emoji, including a skin-tone modifier and a ZWJ family (4-byte characters).
    "Emoji: 🚀🎉👍🏽 and 👨‍👩‍👧 family",
    # Right-to-left scripts.
    "RTL: שלום עולם and مرحبا بالعالم",
    # Contractions, both cases.
    "don't I'll we're they've she'd it's I'm DON'T You'LL",
    # Code.
    'fn main() {\n    println!("{}", x + 1); // comment\n}\n',
    "def f(x):\n\treturn x**2  # squares\n",
    # Special tokens written inline: each must be one id.
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <|im_end|>",
    # The empty string.
    "",
]


def main() -> None:
    if len(sys.argv) > 1:
        model = Path(sys.argv[1])
    else:
        cache = os.environ.get("BALLAST_MODEL_CACHE") or os.path.expanduser(
            "~/.cache/ballast/models"
        )
        model = Path(cache) / MODEL_FILE
    if not model.exists():
        sys.exit(f"{model} is missing; run scripts/fetch-model.sh")
    llm = llama_cpp.Llama(model_path=str(model), vocab_only=True, verbose=False)
    cases = [
        {"text": text, "ids": llm.tokenize(text.encode("utf-8"), add_bos=False, special=True)}
        for text in CASES
    ]
    header = {
        "generator": "scripts/reference/tokenize_strings.py",
        "llama_cpp_python_version": llama_cpp.__version__,
        "model": model.name,
        "add_bos": False,
        "special": True,
    }
    # One case per line, so a diff shows which strings changed.
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in header.items()]
    rows = [" " + json.dumps(c, ensure_ascii=False) for c in cases]
    text = "{\n" + "\n".join(lines) + '\n "cases": [\n' + ",\n".join(rows) + "\n ]\n}\n"
    assert json.loads(text)["cases"] == cases
    root = Path(__file__).resolve().parents[2]
    target = root / "engine/tests/fixtures/smollm2_tokens.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    print(f"wrote {len(cases)} cases to {target}")


if __name__ == "__main__":
    main()
