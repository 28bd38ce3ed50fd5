"""Alternate the scheduling class of a running sweep's play process between SCHED_OTHER (the
trainer's rank) and SCHED_IDLE every WINDOW seconds, and log, once a second, the newest PROGRESS
frame of the run, so that each window's f/s comes from lines seen within a second of being
written. Speed only: the class of a process changes nothing the run computes.

    python results/investigations/cpu-intel-xeon-amx-2c-core-sharing/toggle.py SWEEP_PID RUN_DIR WINDOW PAIRS OUT.tsv
"""

import os
import re
import sys
import time

sweep_pid, run_dir, window, pairs, out = (
    int(sys.argv[1]),
    sys.argv[2],
    float(sys.argv[3]),
    int(sys.argv[4]),
    sys.argv[5],
)


def children(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def cmdline(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except OSError:
        return b""


def players():
    """Play processes: the children of the fork server of each stage process of the sweep."""
    found = []
    for stage in children(sweep_pid):
        for server in children(stage):
            if b"forkserver" in cmdline(server):
                found += children(server)
    return found


def set_class(pid, idle):
    policy = os.SCHED_IDLE if idle else os.SCHED_OTHER
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            os.sched_setscheduler(int(tid), policy, os.sched_param(0))
    except OSError:
        pass


def steal_ticks():
    with open("/proc/stat") as f:
        cpu = [int(x) for x in f.readline().split()[1:9]]
    return sum(cpu), cpu[7]


def last_progress():
    newest = None
    for name in sorted(os.listdir(run_dir)):
        log = os.path.join(run_dir, name, "run.log")
        if os.path.exists(log):
            with open(log, "rb") as f:
                f.seek(max(0, os.path.getsize(log) - 4096))
                for line in f.read().decode(errors="replace").splitlines():
                    m = re.match(r"PROGRESS stage=\S+ frame=(\d+) phase=(\w+)", line)
                    if m:
                        newest = (name, int(m.group(1)), m.group(2))
    return newest


with open(out, "w") as log:
    log.write("t\twindow\tmode\trun\tframe\tphase\ttotal_ticks\tsteal_ticks\n")
    start = time.time()
    for w in range(2 * pairs):
        idle = w % 2 == 1
        end = start + (w + 1) * window
        while time.time() < end:
            for pid in players():
                set_class(pid, idle)
            p = last_progress() or ("", 0, "")
            total, steal = steal_ticks()
            log.write(
                f"{time.time():.1f}\t{w}\t{'idle' if idle else 'other'}\t{p[0]}\t{p[1]}\t{p[2]}\t{total}\t{steal}\n"
            )
            log.flush()
            time.sleep(1.0)
    for pid in players():
        set_class(pid, False)
