"""What a move into a cgroup costs on this host: a sleeping process moved into
a scratch cgroup of the pids hierarchy (v1 or v2), one write to its
`cgroup.procs`, RUNS times, 150 ms apart (so the kernel's lock settles back
between moves as it does between cold forks). Prints the median and the
worst, and whether the host's cgroup2 mount has `favordynmods`
(`host/cgroup_moves.rs`). As root.

    python3 scripts/bench_cgroup_join.py [RUNS]
"""

import os
import statistics
import subprocess
import sys
import time

runs = int(sys.argv[1]) if len(sys.argv) > 1 else 15
parent = "/sys/fs/cgroup/pids" if os.path.isdir("/sys/fs/cgroup/pids") else "/sys/fs/cgroup"
scratch = os.path.join(parent, f"airlock-bench-join-{os.getpid()}")
os.mkdir(scratch)
favored = any(
    line.split(" - ")[1].split()[0] == "cgroup2" and "favordynmods" in line.split(" - ")[1].split()[2].split(",")
    for line in open("/proc/self/mountinfo")
    if " - " in line
)
moves = []
try:
    for _ in range(runs):
        sleeper = subprocess.Popen(["sleep", "5"])
        time.sleep(0.15)
        t = time.perf_counter()
        with open(os.path.join(scratch, "cgroup.procs"), "w") as f:
            f.write(str(sleeper.pid))
        moves.append((time.perf_counter() - t) * 1000)
        sleeper.kill()
        sleeper.wait()
finally:
    os.rmdir(scratch)
print(f"a move into a cgroup ({parent}), favordynmods {'set' if favored else 'not set'}: "
      f"median {statistics.median(moves):.2f} ms, max {max(moves):.2f} ms ({runs} moves)")
