#!/usr/bin/env python3
"""The official `openai` Python client against `lmx serve`, offline: models, completions and chat
completions, whole and streamed, greedy streams equal to the whole answers, and the client's own
exceptions for an unknown model and a wrong API key. Not a CI test (CI has no Python client);
run it by hand or on the GPU machine:

    pip install openai
    python3 bench/serve_openai_client.py --lmx target/debug/lmx --model tests/fixtures/hf/llama

It starts the server itself (with an API key) unless given --url (and --api-key).
"""

import argparse
import subprocess
import sys

import openai


def start(args):
    command = [args.lmx, "serve", "--model", args.model, "--port", "0", "--name", "model",
               "--api-key", args.api_key]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        sys.exit(f"lmx serve printed {line!r}, not its address")
    return process, line[len("listening on "):]


def check(args, url):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=args.api_key, max_retries=0)
    models = [model.id for model in client.models.list()]
    assert models == ["model"], models

    whole = client.completions.create(model="model", prompt="First Citizen", max_tokens=16,
                                      temperature=0)
    text = whole.choices[0].text
    streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(
        model="model", prompt="First Citizen", max_tokens=16, temperature=0, stream=True))
    assert streamed == text, (streamed, text)
    print(f"completion: {text!r} ({whole.usage.completion_tokens} tokens, "
          f"{whole.choices[0].finish_reason})")

    messages = [{"role": "user", "content": "Speak, speak."}]
    chat = client.chat.completions.create(model="model", messages=messages, max_tokens=16,
                                          temperature=0, seed=1)
    content = chat.choices[0].message.content
    chunks = list(client.chat.completions.create(model="model", messages=messages, max_tokens=16,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    joined = "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert joined == content, (joined, content)
    assert chunks[-1].usage.completion_tokens == chat.usage.completion_tokens
    print(f"chat: {content!r}")

    try:
        client.completions.create(model="other", prompt="a", max_tokens=1)
        raise AssertionError("an unknown model was served")
    except openai.NotFoundError as err:
        print(f"unknown model: {err.status_code} {err.body['code']}")
    try:
        openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError as err:
        print(f"wrong key: {err.status_code} {err.body['code']}")
    try:
        client.completions.create(model="model", prompt="a", max_tokens=1, temperature=5)
        raise AssertionError("temperature 5 was accepted")
    except openai.BadRequestError as err:
        print(f"bad temperature: {err.status_code} {err.body['message']}")
    print("ok")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one)")
    parser.add_argument("--lmx", default="target/debug/lmx")
    parser.add_argument("--model", default="tests/fixtures/hf/llama")
    parser.add_argument("--api-key", default="offline-key")
    args = parser.parse_args()
    if args.url:
        check(args, args.url)
        return
    process, url = start(args)
    try:
        check(args, url)
    finally:
        process.terminate()
        process.wait()


if __name__ == "__main__":
    main()
