#!/usr/bin/env python3
"""Reference outputs from llama.cpp for Ballast's real-model tests.

Runs the GGUF model through llama-cpp-python (pinned 0.3.36) on fixed prompts and writes,
per prompt: the prompt's token ids, the first step's 16 largest logits, and 32 greedy
tokens (plain argmax over the raw logits, no sampler), twice: with llama.cpp's default f16
KV cache, and with an f32 KV cache (`greedy_ids_kv_f32`), the precision Ballast keeps. The
engine's test feeds the same ids to Ballast's forward pass and compares.

    python3 -m venv /tmp/llamacpp && /tmp/llamacpp/bin/pip install llama-cpp-python==0.3.36
    /tmp/llamacpp/bin/python scripts/reference/greedy.py "$(scripts/fetch-model.sh)" \
        > engine/tests/fixtures/smollm2_greedy.json

Building the library takes about 25 minutes on two cores; only this script and its
output are committed.
"""
import hashlib
import json
import sys

import llama_cpp
import llama_cpp.llama_cpp as llama_c
import numpy as np


def without_extra_buffers():
    """llama.cpp built for this CPU uses AMX tiles, which the VMs here advertise but fault on
    (SIGILL). Its "extra buffer types" (AMX, and weight repacking, which on x86 covers none
    of this file's Q4_1/Q8_0 tensors) are turned off; the plain CPU kernels remain."""
    default = llama_c.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    llama_c.llama_model_default_params = params


without_extra_buffers()

PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colors are",
    "def fibonacci(n):\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "<|im_start|>user\nList three fruits.<|im_end|>\n<|im_start|>assistant\n",
]
GREEDY_TOKENS = 32
TOP = 16


def last_logits(llm):
    """The logits of the last token evaluated (the only row llama.cpp computes)."""
    row = np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),))
    return np.array(row, dtype=np.float32)


def greedy(llm, ids):
    """First-step logits and GREEDY_TOKENS argmax tokens after `ids`."""
    llm.reset()
    llm.eval(ids)
    first = last_logits(llm)
    out = []
    logits = first
    for _ in range(GREEDY_TOKENS):
        nxt = int(np.argmax(logits))
        out.append(nxt)
        llm.eval([nxt])
        logits = last_logits(llm)
    return first, out


def main(path):
    with open(path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    llm = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, n_batch=512, verbose=False)
    f32_kv = llama_cpp.Llama(model_path=path, n_ctx=512, n_threads=2, n_batch=512, verbose=False,
                             type_k=llama_c.GGML_TYPE_F32, type_v=llama_c.GGML_TYPE_F32)
    cases = []
    for prompt in PROMPTS:
        ids = llm.tokenize(prompt.encode(), add_bos=False, special=True)
        first, out = greedy(llm, ids)
        order = np.argsort(-first)[:TOP]
        _, out_f32 = greedy(f32_kv, ids)
        cases.append({
            "prompt": prompt,
            "prompt_ids": [int(t) for t in ids],
            "top_ids": [int(i) for i in order],
            "top_logits": [round(float(first[i]), 4) for i in order],
            "greedy_ids": out,
            "greedy_text": llm.detokenize(out).decode("utf-8", "replace"),
            "greedy_ids_kv_f32": out_f32,
        })
    json.dump({
        "generator": f"llama-cpp-python {llama_cpp.__version__}, scripts/reference/greedy.py",
        "model_sha256": sha,
        "cases": cases,
    }, sys.stdout, indent=1, ensure_ascii=False)
    print()


if __name__ == "__main__":
    main(sys.argv[1])
