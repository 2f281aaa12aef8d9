#!/usr/bin/env python3
"""Load generator for `lmx serve`: throughput and latency percentiles at several numbers of
concurrent streams (default 1, 8 and 32), over the OpenAI API's streamed completions.

Standard library only, so that it runs wherever the binary does (the GPU machine has no
package index). It starts the server itself unless given --url:

    python3 bench/serve_load.py --lmx target/release/lmx --model path/to/TinyLlama-1.1B \
        --device gpu --concurrency 1 8 32 --requests 64 --prompt-tokens 128 --max-tokens 256

For each concurrency C it sends --requests requests (at least C), C at a time, each a streamed
greedy completion of about --prompt-tokens prompt tokens and exactly --max-tokens generated ones
(the end-of-sequence token is biased away). It reports, per C: total generated tokens per second
(wall clock over the whole batch of requests), the time to the first token and the per-request
decode rate (tokens after the first, over the time after the first), and the request latency,
each as p50/p90/p99. One JSON line per C goes to --out (default: stdout only).
"""

import argparse
import http.client
import json
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def one_request(url, model, prompt, max_tokens, key, eos_bias):
    """Sends one streamed completion; returns (ttft_s, total_s, tokens)."""
    parts = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=600)
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if eos_bias is not None:
        body["logit_bias"] = {str(eos_bias): -100}
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    started = time.perf_counter()
    connection.request("POST", "/v1/completions", json.dumps(body), headers)
    response = connection.getresponse()
    if response.status != 200:
        raise RuntimeError(f"status {response.status}: {response.read()[:300]!r}")
    first = None
    tokens = None
    for raw in response:
        line = raw.decode().strip()
        if not line.startswith("data: "):
            continue
        data = line[len("data: "):]
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            raise RuntimeError(event["error"]["message"])
        if first is None and event["choices"] and event["choices"][0].get("text"):
            first = time.perf_counter() - started
        if event.get("usage"):
            tokens = event["usage"]["completion_tokens"]
    total = time.perf_counter() - started
    connection.close()
    return (first if first is not None else total), total, tokens or 0


def run_level(args, url, concurrency, prompt, eos_bias):
    """Runs max(requests, concurrency) requests, `concurrency` at a time."""
    count = max(args.requests, concurrency)
    results, errors = [], []
    lock = threading.Lock()
    next_index = [0]

    def worker():
        while True:
            with lock:
                if next_index[0] >= count:
                    return
                next_index[0] += 1
            try:
                result = one_request(url, args.name, prompt, args.max_tokens, args.api_key, eos_bias)
                with lock:
                    results.append(result)
            except Exception as err:  # noqa: BLE001 - reported, then the level fails
                with lock:
                    errors.append(str(err))

    started = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} of {count} requests failed, first: {errors[0]}")
    ttft = [r[0] for r in results]
    latency = [r[1] for r in results]
    decode = [(r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1 and r[1] > r[0]]
    tokens = sum(r[2] for r in results)
    row = {
        "concurrency": concurrency,
        "requests": count,
        "generated_tokens": tokens,
        "wall_s": round(wall, 3),
        "tokens_per_s": round(tokens / wall, 1),
        "requests_per_s": round(count / wall, 3),
    }
    for name, values, scale in (("ttft_ms", ttft, 1000), ("latency_ms", latency, 1000),
                                ("stream_tok_s", decode, 1)):
        for q in (50, 90, 99):
            row[f"{name}_p{q}"] = round(percentile(values, q) * scale, 1)
    row["stream_tok_s_mean"] = round(statistics.fmean(decode), 1) if decode else None
    return row


def start_server(args):
    """Starts `lmx serve` on a free port; returns (process, url)."""
    command = [args.lmx, "--device", args.device, "serve", "--model", args.model, "--port", "0",
               "--name", args.name, "--max-batch", str(max(args.concurrency)),
               "--max-queue", str(max(args.requests, max(args.concurrency)) * 2)]
    if args.preset:
        command += ["--preset", args.preset]
    command += args.serve_arg
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        raise RuntimeError(f"lmx serve printed {line!r}, not its address")
    return process, line[len("listening on "):]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server (default: start one with --lmx and --model)")
    parser.add_argument("--lmx", default="target/release/lmx")
    parser.add_argument("--model", help="a model folder, or a registered model's name with --preset")
    parser.add_argument("--preset")
    parser.add_argument("--device", default="gpu")
    parser.add_argument("--name", default="bench", help="the model's id in the API")
    parser.add_argument("--api-key")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=64, help="requests per level (at least C)")
    parser.add_argument("--prompt-tokens", type=int, default=128, help="about this many prompt tokens")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--eos-id", type=int, help="the end-of-sequence id to bias away")
    parser.add_argument("--serve-arg", action="append", default=[], help="passed on to lmx serve")
    parser.add_argument("--out", help="append one JSON line per level here")
    args = parser.parse_args()

    process = None
    url = args.url
    if url is None:
        if not args.model:
            parser.error("give --url, or --model (and --lmx) to start a server")
        process, url = start_server(args)
    try:
        # Text the usual tokenizers split into about one token per word.
        prompt = " ".join(["the"] * args.prompt_tokens)
        one_request(url, args.name, prompt, 4, args.api_key, args.eos_id)  # warm up
        for concurrency in args.concurrency:
            row = run_level(args, url, concurrency, prompt, args.eos_id)
            row.update(model=args.model or url, max_tokens=args.max_tokens,
                       prompt_tokens=args.prompt_tokens, device=args.device)
            print(json.dumps(row), flush=True)
            if args.out:
                with open(args.out, "a") as out:
                    out.write(json.dumps(row) + "\n")
    finally:
        if process is not None:
            process.terminate()
            process.wait()


if __name__ == "__main__":
    sys.exit(main())
