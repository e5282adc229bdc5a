#!/usr/bin/env python3
"""llama.cpp's single-stream prefill and decode speed on a GGUF file, measured the way
engine/benches/real_model.rs measures Ballast: the same 128 prompt ids, then greedy decode
of 128 tokens, two threads. Prints `prefill X tok/s` and `decode Y tok/s`.

    python scripts/reference/bench_llama_cpp.py MODEL.gguf [PROMPT_TOKENS DECODE_TOKENS]
"""
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import greedy  # noqa: E402  (turns off AMX/repack buffers, shares last_logits)
import llama_cpp  # noqa: E402
import numpy as np  # noqa: E402


def main(path, prompt_len=128, decode_len=128):
    llm = llama_cpp.Llama(model_path=path, n_ctx=prompt_len + decode_len + 16, n_threads=2,
                          n_threads_batch=2, n_batch=512, verbose=False)
    prompt = [1000 + (i * 7919) % 30000 for i in range(prompt_len)]
    llm.eval(prompt[:16])  # warm the map and caches, as the Rust bench does
    llm.reset()
    t = time.perf_counter()
    llm.eval(prompt)
    prefill = time.perf_counter() - t
    nxt = int(np.argmax(greedy.last_logits(llm)))
    t = time.perf_counter()
    for _ in range(decode_len):
        llm.eval([nxt])
        nxt = int(np.argmax(greedy.last_logits(llm)))
    decode = time.perf_counter() - t
    print(f"prefill            {prompt_len / prefill:.1f} tok/s ({prompt_len} tokens)")
    print(f"decode             {decode_len / decode:.1f} tok/s ({decode_len} tokens)")


if __name__ == "__main__":
    main(sys.argv[1], *map(int, sys.argv[2:4]))
