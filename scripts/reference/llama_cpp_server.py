#!/usr/bin/env python3
"""llama-cpp-python's OpenAI server with the same llama.cpp settings as the other reference
scripts (AMX and repacking buffers off; see greedy.py). Arguments are the server's own:

    python scripts/reference/llama_cpp_server.py --model MODEL.gguf --n_threads 2 --port 8001
"""
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import greedy  # noqa: E402,F401  (patches llama.cpp's default model parameters)
from llama_cpp.server.__main__ import main  # noqa: E402

if __name__ == "__main__":
    main()
