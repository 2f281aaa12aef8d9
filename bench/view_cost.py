"""The host's cost of MLX operations that launch no kernel (views: reshapes and transposes of a
one-row array, as a decoded token's attention makes them) in a compiled function's replay and
evaluation, beside elementwise sums that MLX fuses into one kernel. Run with Python MLX on any
device (the views' cost is the host's alone):

    python3 bench/view_cost.py

Prints microseconds a call and an operation, three rounds of 2,000 calls each.
"""

import time

import mlx.core as mx

N = 120


def views(x):
    y = x
    for _ in range(N // 2):
        y = mx.reshape(y, (1, 1, 12, 64))
        y = mx.transpose(y, (0, 2, 1, 3))
        y = mx.reshape(y, (1, 1, 768))
    return y + 1


def sums(x):
    y = x
    for _ in range(N):
        y = y + 1
    return y


def main():
    x = mx.zeros((1, 1, 768))
    for name, f, ops in (("views", views, (N // 2) * 3 + 1), ("fused sums", sums, N)):
        g = mx.compile(f)
        mx.eval(g(x))
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(2000):
                mx.eval(g(x))
            call = (time.perf_counter() - start) / 2000 * 1e6
            print(f"{name}: {call:.1f} us a call, {ops} operations, {call / ops:.2f} us an operation")


if __name__ == "__main__":
    main()
