"""Runs a command and prints one JSON object: its wall time and the peak resident memory of the
process tree it started (the largest child's, as getrusage reports it).

    python bench/measure.py NAME -- COMMAND ...
"""

import json
import resource
import subprocess
import sys
import time


def main():
    name = sys.argv[1]
    command = sys.argv[sys.argv.index("--") + 1 :]
    start = time.perf_counter()
    status = subprocess.run(command, stdout=subprocess.DEVNULL).returncode
    wall = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps(dict(name=name, status=status, wall_s=round(wall, 3),
                          peak_rss_gb=round(peak_kib / 2**20, 3))))


if __name__ == "__main__":
    main()
