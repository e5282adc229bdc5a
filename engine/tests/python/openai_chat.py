"""Asks a Ballast engine a question through the official `openai` client, plain and streamed,
and prints what came back as JSON for the Rust test to check."""
import json
import sys

from openai import OpenAI

client = OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused")
messages = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
reply = client.chat.completions.create(
    model=sys.argv[2], messages=messages, temperature=0, max_tokens=48
)
stream = client.chat.completions.create(
    model=sys.argv[2], messages=messages, temperature=0, max_tokens=48, stream=True
)
streamed = ""
for chunk in stream:
    if chunk.choices and chunk.choices[0].delta.content:
        streamed += chunk.choices[0].delta.content
models = [m.id for m in client.models.list()]
print(json.dumps({
    "content": reply.choices[0].message.content,
    "finish_reason": reply.choices[0].finish_reason,
    "completion_tokens": reply.usage.completion_tokens,
    "streamed": streamed,
    "models": models,
}))
