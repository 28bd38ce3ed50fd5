"""``python -m lib.sweep`` / ``dqn-sweep``: the command line, its checks, and ``main``.

Every check runs before anything is made (the flags, the grid, the stage flags against each
stage's own command line, the output folder, the pool's cores and GPUs or the Ray cluster):
bad input is one line on stderr and exit code 2. Then the runs go, and the report is written
however the sweep ends: exit code 1 when a run failed, 130 / 143 on Ctrl-C / SIGTERM.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import sys
import time

from lib.bench import machine
from lib.params import GAMES
from lib.run import cli, scripts, signals
from lib.run.cli import EXIT_FAILED, UsageError
from lib.run.stages import ROOT
from lib.sweep import report
from lib.sweep.driver import Sweep
from lib.sweep.grid import (
    Job,
    RunSpec,
    carried_jobs,
    checkpoint_frame,
    job_from_state,
    plan,
    read_summary,
    run_complete,
    seed_text,
)
from lib.sweep.local_pool import LocalPool
from lib.sweep.ray_pool import RayPool

SAVE_EVERY = 50_000  # agent steps between a run's checkpoints: what a retry can lose
PROGRESS_SEC = 30.0  # seconds between progress lines, the sweep's and each run's (--progress)


def make_parser() -> cli.Parser:
    p = cli.Parser(
        prog="dqn-sweep",
        usage="%(prog)s --stages LIST [options] [-- STAGE FLAGS]",
        description=sys.modules[__package__].__doc__.split("\n\n")[0],  # the package docstring's first line
        epilog="Stage flags after a lone -- go to every run (-- --replay-initial 1000); a stage's own knob "
        "(--steps, --envs) only to the stages that have it.",
    )
    p.add_argument("--stages", help="comma-separated stages, e.g. 05,06,07 (required, except with --report)")
    p.add_argument("--seeds", default="0", help="seeds: N, A-B or a comma list (default 0)")
    p.add_argument("--games", default="pong", help=f"comma-separated games: {', '.join(GAMES)} (default pong)")
    p.add_argument("--max-frames", type=cli.positive, help="agent steps per run (default: until solved)")
    p.add_argument(
        "--arm",
        dest="arms",
        action="append",
        metavar="NAME=FLAGS",
        help="an arm of the grid: every stage x seed x game again with these stage flags added, in run folders "
        "named <stage>+NAME-<game>-seed<S> (repeat for more arms; NAME= alone: the stages as they are)",
    )
    p.add_argument("--per-run-cpus", type=cli.positive_float, default=2.0, help="CPUs a run takes (default 2)")
    p.add_argument(
        "--per-run-gpus",
        type=cli.non_negative_float,  # a share of GPUs
        default=None,
        help="GPUs a run takes; below 1 several runs share a GPU (default 1 where there are GPUs, else 0)",
    )
    p.add_argument(
        "--address", metavar="HOST:PORT", help="HOST:PORT of an existing Ray cluster's head (default: this machine)"
    )
    p.add_argument("--out", default=os.path.join("runs", "sweep"), help="the sweep's folder (default runs/sweep)")
    p.add_argument(
        "--save-every",
        type=cli.positive,
        default=SAVE_EVERY,
        help=f"agent steps between a run's checkpoints (default {SAVE_EVERY})",
    )
    p.add_argument(
        "--save-replay",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="checkpoints hold each run's replay ring, so that a resume refills nothing, where the disk of --out "
        "has room (default: on; about 0.7 GB a run for 100k slots)",
    )
    p.add_argument("--progress", type=cli.positive_float, default=PROGRESS_SEC, metavar="SEC",
                   help=f"seconds between progress lines (default {PROGRESS_SEC:g})")  # fmt: skip
    p.add_argument(
        "--report",
        action="store_true",
        help="run nothing: write the --out folder's README.md and seed statistics again from its sweep.json "
        "and run folders",
    )
    return p


GRID_FLAGS = ("--stages", "--seeds", "--games", "--max-frames", "--arm")  # with --report, sweep.json's grid holds them


def dest(flag: str) -> str:
    """The attribute argparse gives a flag: --max-frames -> max_frames."""
    return "arms" if flag == "--arm" else flag.removeprefix("--").replace("-", "_")


def parse_args(argv: list[str]):
    """Sweep flags before a lone ``--``, stage flags after it."""
    if "--" in argv:
        cut = argv.index("--")
        argv, flags = argv[:cut], argv[cut + 1 :]
    else:
        flags = []
    parser = make_parser()
    args = parser.parse_args(argv)
    if args.report:
        given = [flag for flag in GRID_FLAGS if getattr(args, dest(flag)) != parser.get_default(dest(flag))]
        if given or flags:
            what = ", ".join(given + (["stage flags after --"] if flags else []))
            raise UsageError(f"--report: {what}: the grid is the one the folder's sweep.json records")
    elif not args.stages:
        raise UsageError("the following arguments are required: --stages")
    if args.per_run_gpus is not None and args.per_run_gpus > 1 and args.per_run_gpus != int(args.per_run_gpus):
        raise UsageError(f"--per-run-gpus {args.per_run_gpus:g}: above 1, a run takes whole GPUs")
    args.flags = flags
    return args


def _check_out(out: str) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(f"--out {out}: is a file")
    cli.check_writable_dir(out, "--out")


def _make_pool(args):
    """Where the runs go, checked against what it offers (UsageError)."""
    if args.address:
        pool = RayPool(args.address, args.per_run_cpus, args.per_run_gpus)
        pool.connect()
    else:
        pool = LocalPool(args.per_run_cpus, args.per_run_gpus, os.path.join(args.out, ".work"))
        pool.check()
    return pool


def _grid(specs: list[RunSpec], args) -> tuple[dict, str]:
    """The grid as sweep.json records it, and its size in words."""
    stages = sorted({s.stage for s in specs})
    seeds = sorted({s.seed for s in specs})
    games = sorted({s.game for s in specs}, key=list(GAMES).index)
    grid = {"stages": ",".join(stages), "seeds": seed_text(seeds), "games": ",".join(games),
            "max_frames": args.max_frames, "flags": args.flags}  # fmt: skip
    size = f"{len(stages)} stages x {len(seeds)} seeds x {len(games)} games"
    if args.arms:
        grid["arms"] = list(args.arms)
        size += f" x {len(args.arms)} arms"
    return grid, size


def _skip_finished(sweep: Sweep, jobs: list[Job]) -> tuple[int, int]:
    """Mark the runs an earlier invocation finished, and those whose checkpoint is past
    --max-frames already (a smaller budget than theirs); each run keeps the attempts, host and
    node that earlier invocations recorded. How many of each."""
    before = report.previous_runs(sweep.out)
    for job in jobs:
        folder, limit, earlier = sweep.folder(job), job.spec.max_frames, before.get(job.spec.key, {})
        job.earlier = earlier.get("attempts") or 0
        if run_complete(folder, limit):
            job.status = "skipped"
            job.frame = (read_summary(folder) or {}).get("frames", 0)
        elif limit is not None and (checkpoint_frame(folder) or 0) >= limit:
            job.status, job.frame = "skipped", checkpoint_frame(folder)
            job.reason = f"its checkpoint is at frame {job.frame}, past --max-frames {limit}"
            sweep.log(f"run {job.spec.key}: not run: {job.reason}")
        if job.status == "skipped":
            job.host, job.node, job.ringless = earlier.get("host"), earlier.get("node"), earlier.get("ringless")
    past = sum(j.status == "skipped" and j.reason is not None for j in jobs)
    return sum(j.status == "skipped" for j in jobs) - past, past


def _drive(sweep: Sweep, pool, out: str) -> tuple[int, str]:
    """Run the sweep to its end or until Ctrl-C, SIGTERM or SIGHUP (a second one kills the runs
    at once); the exit code and the outcome in words. The signals are recorded, never raised:
    Ray's ``ray.wait`` would turn a raise into a SystemError; the loop looks between its polls."""
    code, outcome = 0, "complete"
    received: list[int] = []
    restore = signals.record_stops(received)
    try:
        sweep.run(received)
        if received:
            code, outcome = 128 + received[0], "interrupted"
            sweep.stop(code, received)
    finally:
        restore()
        signals.ignore_stops()
        pool.close()
        shutil.rmtree(os.path.join(out, ".work"), ignore_errors=True)
    return code, outcome


def _recorded(out: str) -> tuple[dict, dict, dict]:
    """The grid, the runs' states and the last invocation that the folder's sweep.json records."""
    path = os.path.join(out, "sweep.json")
    try:
        with open(path) as f:
            state = json.load(f)
    except FileNotFoundError:
        raise UsageError(f"--out {out}: no sweep.json (no sweep has ended in this folder)")
    except (OSError, ValueError) as e:
        raise UsageError(f"--out {out}: sweep.json cannot be read ({getattr(e, 'strerror', None) or e})")
    state = state if isinstance(state, dict) else {}
    grid, invocations = state.get("grid"), report.invocations_of(state)
    if not isinstance(grid, dict) or not {"stages", "seeds", "games"} <= grid.keys() or not invocations:
        raise UsageError(f"--out {out}: sweep.json does not hold a sweep's grid and invocations")
    return grid, report.runs_of(state), invocations[-1]


def _report_main(args) -> int:
    """--report: the README and seed statistics again, from what the folder records; nothing runs."""
    grid, states, last = _recorded(args.out)
    recorded = argparse.Namespace(**{**vars(args), "stages": grid["stages"], "seeds": str(grid["seeds"]),
                                     "games": grid["games"], "max_frames": grid.get("max_frames"),
                                     "flags": list(grid.get("flags") or []), "arms": grid.get("arms")})  # fmt: skip
    jobs = [job_from_state(spec, states.get(spec.key) or {}) for spec in plan(recorded)]
    sweep = Sweep(jobs, args.out, None, args.progress)
    sweep.carried = carried_jobs(sweep.runs_dir, sweep.jobs, states)
    hardware = last.get("hardware") or [
        f"- where: {last.get('where', '?')}",
        "- hardware: not recorded (this invocation came before sweeps recorded it)",
    ]
    meta = {**last, "grid": grid, "hardware": hardware}
    report.write_report(args.out, sweep, meta, record=False)
    print(f"sweep: wrote {os.path.join(args.out, 'README.md')} (from sweep.json; nothing ran)", flush=True)
    return 0


def _main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.report:
        return _report_main(args)
    scripts.require_scripts("the sweep")
    specs = plan(args)
    _check_out(args.out)
    pool = _make_pool(args)
    # The share asked may have been "auto": every run gets the one resolved.
    specs = [dataclasses.replace(s, gpus=pool.gpus) for s in specs]
    if args.save_replay and pool.kind == "ray":
        print("sweep: runs on a Ray cluster go without their replay ring (it would travel through Ray's object "
              "store): each resume refills the buffer", flush=True)  # fmt: skip
        specs = [dataclasses.replace(s, save_replay=False) for s in specs]
    grid, size = _grid(specs, args)

    # Input is good: from here on, things are made.
    started = time.monotonic()
    date = datetime.datetime.now().isoformat(timespec="seconds")
    commit = cli.git_commit(ROOT)  # the code the runs start from, not whatever is checked out when they end
    os.makedirs(os.path.join(args.out, "runs"), exist_ok=True)
    shutil.rmtree(os.path.join(args.out, ".work"), ignore_errors=True)  # left by a killed driver
    jobs = [Job(s) for s in specs]
    sweep = Sweep(jobs, args.out, pool, args.progress)
    skipped, past = _skip_finished(sweep, jobs)
    sweep.carried = carried_jobs(sweep.runs_dir, sweep.jobs, report.previous_runs(args.out))
    past_words = f", {past} past --max-frames" if past else ""
    print(f"sweep: {len(jobs)} runs ({size}), {skipped} finished before{past_words}, "
          f"{len(jobs) - skipped - past} to run; {pool.describe()}", flush=True)  # fmt: skip

    code, outcome = _drive(sweep, pool, args.out)
    if code == 0 and any(j.status == "failed" for j in jobs):
        code, outcome = EXIT_FAILED, "runs failed"
    meta = {
        "command": machine.command_line(argv, "dqn-sweep", "lib.sweep"), "commit": commit, "date": date,
        "wall_s": round(time.monotonic() - started, 1), "where": pool.describe(), "outcome": outcome, "grid": grid,
        "hardware": report.hardware_lines(pool),
    }  # fmt: skip
    report.write_report(args.out, sweep, meta)
    print(report.progress_line(sweep).split("; ETA")[0], flush=True)
    print(f"sweep: wrote {os.path.join(args.out, 'README.md')}", flush=True)
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return _main(argv)
    except UsageError as e:
        return cli.usage_exit("sweep", e)
