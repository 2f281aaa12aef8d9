"""Symbolizes and summarizes the stacks that bench/host_sampler.c wrote: where one thread's wall
time goes, by function, inclusive (anywhere on the stack) and exclusive (the innermost frame).

    python3 bench/host_profile.py lmx.stacks --binary lmx=target/release/lmx \
        --binary libmlx.so=.gpu/mlx/lib/libmlx.so --step-ms 2.99 [--under NAME] [--top 40]

The stacks name the binaries by their paths on the machine that ran them; --binary NAME=PATH
gives the copy of the binary whose file name is NAME to read symbols from here (the same
build). Binaries not given are read at their recorded path when it exists here. --step-ms, the
run's time per step, turns the shares of samples into milliseconds per step. --under keeps only
the samples whose stack passes through a function whose name contains NAME; --last keeps the
last samples alone (samples are in time order: the steady state, once compilation is behind).
"""

import argparse
import bisect
import collections
import os
import re
import struct
import subprocess

from trace_summary import short


class Module:
    """One mapped binary: its load segments (to turn a file offset into an address) and symbols."""

    def __init__(self, path):
        self.path = path
        self.segments = load_segments(path) if path and os.path.exists(path) else []
        self.starts, self.ends, self.names = symbols(path) if self.segments else ([], [], [])
        self.functions = functions(path) if self.segments else []

    def address(self, file_offset):
        for offset, vaddr, size in self.segments:
            if offset <= file_offset < offset + size:
                return file_offset - offset + vaddr
        return None

    def symbol(self, address):
        """The symbol whose extent holds `address`, else the unnamed function (by its unwind
        table entry) that does: `+0x...`, its start."""
        i = bisect.bisect_right(self.starts, address) - 1
        if i >= 0 and address < self.ends[i]:
            return self.names[i]
        i = bisect.bisect_right(self.functions, (address, float("inf"))) - 1
        if i >= 0 and address < self.functions[i][1]:
            return f"+{self.functions[i][0]:#x}"
        return None


def load_segments(path):
    """The (file offset, virtual address, size) of each PT_LOAD of a 64-bit ELF file."""
    with open(path, "rb") as f:
        header = f.read(64)
        if header[:4] != b"\x7fELF" or header[4] != 2:
            return []
        phoff, = struct.unpack_from("<Q", header, 32)
        phentsize, phnum = struct.unpack_from("<HH", header, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    segments = []
    for i in range(phnum):
        kind, _, offset, vaddr, _, filesz = struct.unpack_from("<IIQQQQ", table, i * phentsize)
        if kind == 1:
            segments.append((offset, vaddr, filesz))
    return segments


def symbols(path):
    """Function symbols (static and dynamic) with their sizes, sorted by address, demangled."""
    table = {}
    for flags in (["--defined-only"], ["-D", "--defined-only"]):
        run = subprocess.run(["nm", "-C", "-S", *flags, path], capture_output=True, text=True)
        for line in run.stdout.splitlines():
            parts = line.split(" ", 3)
            if len(parts) == 4 and parts[2] in "tTwWiI":
                table.setdefault(int(parts[0], 16), (int(parts[1], 16), parts[3]))
    starts = sorted(table)
    return starts, [s + table[s][0] for s in starts], [table[s][1] for s in starts]


def functions(path):
    """Every function's (start, end) from the unwind tables, for binaries stripped of symbols."""
    run = subprocess.run(
        ["readelf", "--debug-dump=frames", path], capture_output=True, text=True
    )
    found = re.findall(r" FDE cie=\S+ pc=([0-9a-f]+)\.\.([0-9a-f]+)", run.stdout)
    return sorted((int(a, 16), int(b, 16)) for a, b in found)


def read(path):
    maps, stacks = [], []
    with open(path) as f:
        for line in f:
            if line.startswith("maps "):
                fields = line.split()
                if len(fields) >= 7 and "x" in fields[2]:
                    start, end = (int(x, 16) for x in fields[1].split("-"))
                    maps.append((start, end, int(fields[3], 16), fields[6]))
            elif line.startswith("stack"):
                stacks.append([int(x, 16) for x in line.split()[1:]])
    maps.sort()
    return maps, stacks


def main():
    p = argparse.ArgumentParser()
    p.add_argument("stacks")
    p.add_argument("--binary", action="append", default=[], metavar="NAME=PATH")
    p.add_argument("--step-ms", type=float)
    p.add_argument("--under")
    p.add_argument("--last", type=int, help="keep only the last LAST samples (the steady state)")
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    given = dict(item.split("=", 1) for item in args.binary)
    maps, stacks = read(args.stacks)
    starts = [m[0] for m in maps]
    modules = {}

    def name_of(address, exact):
        i = bisect.bisect_right(starts, address) - 1
        if i < 0 or address >= maps[i][1]:
            return "[unknown]"
        start, _, offset, path = maps[i]
        base = os.path.basename(path)
        if path not in modules:
            modules[path] = Module(given.get(base, path))
        module = modules[path]
        lookup = address if exact else address - 1
        vaddr = module.address(lookup - start + offset)
        symbol = module.symbol(vaddr) if vaddr is not None else None
        return f"{short(symbol, 110)} [{base}]" if symbol else f"[{base}]"

    if args.last:
        stacks = stacks[-args.last :]
    named = [[name_of(a, i == 0) for i, a in enumerate(stack)] for stack in stacks]
    if args.under:
        named = [s for s in named if any(args.under in f for f in s)]
    total = len(named)
    if not total:
        print("no samples")
        return
    inclusive, exclusive, modules_leaf = (collections.Counter() for _ in range(3))
    for stack in named:
        exclusive[stack[0] if stack else "[empty]"] += 1
        modules_leaf[stack[0].rsplit("[", 1)[-1].rstrip("]") if stack else "?"] += 1
        for name in set(stack):
            inclusive[name] += 1
    scale = args.step_ms / total if args.step_ms else None

    def table(title, counter):
        print(title)
        for name, count in counter.most_common(args.top):
            per_step = f"{count * scale:8.3f} ms" if scale else ""
            print(f"{100 * count / total:6.1f}% {per_step}  {name}")
        print()

    print(f"{total} samples" + (f" (--under {args.under})" if args.under else "") + "\n")
    table("inclusive (anywhere on the stack):", inclusive)
    table("exclusive (innermost frame):", exclusive)
    table("exclusive, by binary:", modules_leaf)


if __name__ == "__main__":
    main()
