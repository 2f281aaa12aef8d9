"""Summarizes a GPU timeline written by bench/cupti_trace.c: where the steady-state steps spend
their time on the GPU, and what the host does while the GPU waits.

    python3 bench/trace_summary.py lmx.tsv --step-ms 1.9 [--last 0.5] [--after NAME]

The window is the last fraction of the kernels (by count; the steady-state steps, once the
warm-up and the first compiled trace are behind). --after NAME narrows it to the kernels after
the last one whose name contains NAME: a GRPO run's last update, after its last rollout's
decoding kernels. --step-ms, the run's measured time per step, turns the window's totals into
per-step figures.
"""

import argparse
import bisect
import collections


def short(name, width=70):
    """A kernel's name without its template arguments and parameter list."""
    depth, kept = 0, []
    for ch in name:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        elif depth == 0:
            kept.append(ch)
    text = "".join(kept).strip() or name
    return text if len(text) <= width else text[: width - 3] + "..."


def read(path):
    rows, dropped = collections.defaultdict(list), 0
    with open(path) as f:
        for line in f:
            if line.startswith("# dropped "):
                dropped = int(line.split()[2])
                continue
            parts = line.rstrip("\n").split("\t", 4)
            if len(parts) == 5:
                rows[parts[0]].append((int(parts[1]), int(parts[2]), parts[3], parts[4]))
    for kind in rows:
        rows[kind].sort()
    return rows, dropped


def main():
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--last", type=float, default=0.5)
    p.add_argument("--step-ms", type=float, default=None)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--after", default=None)
    args = p.parse_args()
    if not 0 < args.last <= 1:
        p.error("--last is a fraction in (0, 1]")

    rows, dropped = read(args.trace)
    if dropped:
        print(f"warning: CUPTI dropped {dropped} records; the figures below are incomplete")
    kernels = rows["K"]
    if not kernels:
        print("no kernels in", args.trace)
        return
    window = kernels[int(len(kernels) * (1 - args.last)):]
    if args.after:
        marks = [i for i, k in enumerate(window) if args.after in k[3]]
        if not marks or marks[-1] + 1 == len(window):
            print(f"no kernels after one named like {args.after!r} in the window")
            return
        window = window[marks[-1] + 1:]
    t0, t1 = window[0][0], max(end for _, end, _, _ in window)
    span = (t1 - t0) / 1e6
    steps = span / args.step_ms if args.step_ms else None
    per = (lambda x: x / steps) if steps else (lambda x: x)
    unit = "per step" if steps else "in the window"

    busy, gaps, cursor = 0, [], t0
    for start, end, _, _ in window:
        if start > cursor:
            gaps.append((start - cursor, cursor, start))
        if end > cursor:
            busy += end - max(start, cursor)
            cursor = end
    busy_ms = busy / 1e6
    print(f"window: {len(window)} kernels over {span:.2f} ms"
          + (f" (~{steps:.1f} steps of {args.step_ms} ms)" if steps else ""))
    print(f"GPU busy {busy_ms:.2f} ms ({100 * busy_ms / span:.1f}%), idle {span - busy_ms:.2f} ms")
    if steps:
        print(f"{unit}: {len(window) / steps:.0f} kernels, busy {busy_ms / steps:.3f} ms, "
              f"idle {(span - busy_ms) / steps:.3f} ms")

    print(f"\nkernels by total time ({unit}):")
    by_name = collections.defaultdict(lambda: [0, 0])
    for start, end, _, name in window:
        entry = by_name[short(name)]
        entry[0] += 1
        entry[1] += end - start
    print(f"{'count':>8} {'ms':>8} {'mean us':>8}  name")
    for name, (n, total) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{per(n):8.1f} {per(total) / 1e6:8.3f} {total / n / 1e3:8.2f}  {name}")

    print(f"\nidle gaps between kernels ({unit}):")
    edges = [0, 2_000, 10_000, 50_000, 200_000, float("inf")]
    for lo, hi in zip(edges, edges[1:]):
        chosen = [g for g, _, _ in gaps if lo <= g < hi]
        label = f"{lo / 1e3:g}-{hi / 1e3:g} us" if hi != float("inf") else f">{lo / 1e3:g} us"
        print(f"  {label:>14}: {per(len(chosen)):8.1f} gaps, {per(sum(chosen)) / 1e6:8.3f} ms")

    # Driver (D) and runtime (R) calls; A is both, in traces of the tracer's first version.
    apis = sorted(rows["D"] + rows["R"] + rows["A"])
    starts = [a[0] for a in apis]
    longest = max((end - start for start, end, _, _ in apis), default=0)
    print("\nlargest gaps, with the host calls under way during each:")
    for gap, lo, hi in sorted(gaps, reverse=True)[:8]:
        # Every call that overlaps the gap starts after lo - longest.
        i = bisect.bisect_left(starts, lo - longest)
        during = collections.Counter()
        for start, end, _, name in apis[i:]:
            if start >= hi:
                break
            if end > lo:
                during[name] += 1
        calls = ", ".join(f"{name} x{n}" for name, n in during.most_common(4)) or "none"
        print(f"  {gap / 1e3:8.1f} us: {calls}")

    for kind, label in (("R", "runtime calls"), ("D", "driver calls"), ("A", "API calls")):
        in_window = [a for a in rows[kind] if t0 <= a[0] <= t1]
        if not in_window:
            continue
        print(f"\n{label} by total time ({unit}):")
        by_api = collections.defaultdict(lambda: [0, 0])
        for start, end, _, name in in_window:
            by_api[name][0] += 1
            by_api[name][1] += end - start
        for name, (n, total) in sorted(by_api.items(), key=lambda kv: -kv[1][1])[:10]:
            print(f"{per(n):8.1f} {per(total) / 1e6:8.3f} ms  {name}")

    copies = [r for r in rows["M"] if t0 <= r[0] <= t1]
    by_kind = collections.Counter(r[3].split(":")[0] for r in copies)
    print(f"\ncopies ({unit}): {per(len(copies)):.1f}, "
          f"{per(sum(r[1] - r[0] for r in copies)) / 1e6:.3f} ms; by CUPTI copy kind "
          + ", ".join(f"{k}: {per(n):.1f}" for k, n in by_kind.most_common()))
    memsets = [r for r in rows["S"] if t0 <= r[0] <= t1]
    print(f"memsets ({unit}): {per(len(memsets)):.1f}, "
          f"{per(sum(r[1] - r[0] for r in memsets)) / 1e6:.3f} ms")
    faults = [r for r in rows["U"] if t0 <= r[0] <= t1]
    by_counter = collections.Counter(r[2] for r in faults)
    print(f"unified-memory events ({unit}): {per(len(faults)):.1f}; by CUPTI counter kind "
          + ", ".join(f"{k}: {per(n):.1f}" for k, n in by_counter.most_common()))
    print("(kernels alone count as busy: copies and memsets are listed, not in the busy time)")


if __name__ == "__main__":
    main()
