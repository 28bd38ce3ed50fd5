"""The weights' age and torn reads of stages 03-08 on this machine (lib.run.probes.weights_age.WeightsAge).

Each stage runs in-process on CPU on Pong for --max-frames 4000 past --replay-initial 1000 (750
train steps of batch 128 at N=4), 07 and 08 with K=4 and K=30 games. Epsilon is held at its final
0.02 (late training, the state of most of a run): 98% of actions are greedy forwards, the reads
that can be torn; the rest of Pong's set is the article's. Writes weights_age.json beside itself.

    PYTHONPATH=. python results/cpu-intel-xeon-amx-2c-weights-age/measure.py [--only '07 K=4,07 K=30'] [--frames 4000]
"""

import argparse
import json
import os
import tempfile
import time

from lib.params import GAMES
from lib.run.scripts import load_script

RUNS = [("03", 0), ("07", 4), ("07", 30), ("08", 4), ("08", 30), ("06", 0), ("04", 0), ("05", 0)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", default=None, help="runs by key, e.g. '03,07 K=30'")
    parser.add_argument("--frames", type=int, default=4000)
    parser.add_argument("--epsilon", type=float, default=0.02)
    args = parser.parse_args()
    GAMES["ponglate"] = GAMES["pong"].replace(epsilon_start=args.epsilon, epsilon_final=args.epsilon)
    out_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "weights_age.json")
    results = json.load(open(out_path)) if os.path.exists(out_path) else {}
    for stage, envs in RUNS:
        key = f"{stage}" + (f" K={envs}" if envs else "")
        if args.only and key not in args.only.split(","):
            continue
        argv = ["--device", "cpu", "--game", "ponglate", "--replay-initial", "1000", "--max-frames", str(args.frames)]
        argv += ["--envs", str(envs)] if envs else []
        started = time.perf_counter()
        outcome = load_script(stage).main([*argv, "--quiet", "--run-dir", tempfile.mkdtemp()])
        summary = outcome.summary
        results[key] = {
            "argv": argv,
            "code": outcome.code,
            "fps": summary["fps"],
            "train_frames": summary["train_frames"],
            "threads": summary["threads"],
            "weights_age": summary["weights_age"],
            "seconds": round(time.perf_counter() - started, 1),
            "epsilon": args.epsilon,
            "date": summary["date"],
            "commit": summary["commit"],
        }
        print(key, json.dumps(results[key]), flush=True)
        with open(out_path, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
