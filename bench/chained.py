"""Timing shared by the kernel probes (`decode_attention_probe.py`, `gated_mlp_probe.py`)."""

import statistics
import time

import mlx.core as mx


def chained(step, x, reps):
    """Median seconds a call of `step(x, i)` (call `i` of `reps`, each fed the last one's output,
    evaluated at once) over 7 rounds, after one untimed call: the kernel, the GPU's gap between
    two graph nodes and whatever of the host's launch work the GPU waits for."""
    mx.eval(step(x, 0))
    rounds = []
    for _ in range(7):
        y = x
        for i in range(reps):
            y = step(y, i)
        mx.synchronize()
        start = time.perf_counter()
        mx.eval(y)
        mx.synchronize()
        rounds.append((time.perf_counter() - start) / reps)
    return statistics.median(rounds)
