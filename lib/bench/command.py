"""``python -m lib.bench`` / ``dqn-bench``: the command line, its checks, and the run.

Everything goes to ``<out>/<tag>/`` (``--out``: ``results`` for a full bench, ``runs/bench`` for
``--quick``): fps.csv, sweep.csv, bounds.csv, meta.json, a Markdown
report (README.md) with the article's figures beside ours, and two charts (ratios.png,
sweep.png). A failed stage run is recorded with its last stderr line and the bench goes on
(exit code 1 at the end); Ctrl-C ends the running stage and writes what was collected (exit
130). Bad flags end the program with one line on stderr and exit code 2, creating nothing.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import re
import shutil
import signal
import sys
import tempfile
import time

from lib.bench import launch, machine, parts, report, rounds
from lib.bench.bounds import bound_spread, greedy_fraction
from lib.params import GAMES
from lib.run import cli, runlock, scripts
from lib.run.checkpoint import load_checkpoint
from lib.run.cli import EXIT_FAILED, EXIT_OK, EXIT_SIGINT, EXIT_SIGTERM, Terminated, UsageError
from lib.run.knobs import KNOBS
from lib.run.probes.trackers import RewardTracker
from lib.run.runtime import malloc_setting
from lib.run.stages import STAGES, parse_stages

PROG = "dqn-bench"
# (device is CUDA, --quick) -> (training frames per stage run, seconds per part of a bound, rounds).
# The full CPU bench keeps three rounds of every stage and the sweep near 30 minutes on 2 cores.
DEFAULTS = {
    (False, False): (2400, 3.0, 3),
    (False, True): (600, 1.0, 1),
    (True, False): (10000, 3.0, 3),
    (True, True): (4000, 1.0, 1),
}
# Where the results folder goes without --out: a full bench into the committed results/, a quick
# one under runs/ (ignored by git), so that trying the bench leaves the checkout clean.
OUT = {"full": "results", "quick": os.path.join("runs", "bench")}


def make_parser() -> cli.Parser:
    p = cli.Parser(
        prog=PROG,
        description="The article's table on this machine: every stage, the play-steps "
        "sweep and each stage's bound, in interleaved rounds.",
    )
    cli.add_device(p)
    p.add_argument("--quick", action="store_true", help="one round, small budgets: about 5 minutes on a 2-core CPU")
    p.add_argument("--repeat", type=cli.positive, metavar="R", help="rounds of every run (default 3, --quick 1)")
    p.add_argument(
        "--frames",
        type=cli.positive,
        help="training frames per stage run after warm-up (CPU 2400, CUDA 10000; --quick 600, 4000)",
    )
    p.add_argument("--sweep-frames", type=cli.positive, help="training frames per sweep run (default: --frames / 2)")
    p.add_argument("--replay-initial", type=cli.positive, default=1000, help="warm-up transitions before training")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages to run (default: all)")
    p.add_argument("--no-sweep", action="store_true", help="skip the stage-02 --steps 1..6 sweep")
    p.add_argument(
        "--out",
        help=f"results root; the bench writes <out>/<tag>/ (default: {OUT['full']}, {OUT['quick']} with --quick)",
    )
    p.add_argument("--tag", help="results folder name (default: from the CPU or GPU model, plus -quick with --quick)")
    p.add_argument("--seed", type=cli.count, default=0, help="seed of every run")
    p.add_argument(
        "--envs", type=cli.positive, help="K of the stages with --envs (default: their --envs auto, 4 on CPU)"
    )
    p.add_argument(
        "--precision",
        choices=KNOBS["precision"].choices,
        default=KNOBS["precision"].default,
        help="the learner's arithmetic in the stages with --precision (default: their auto)",
    )
    p.add_argument(
        "--bound-seconds",
        type=cli.positive_float,
        help="seconds per part of a bound, each measured right before its stage's run (3, --quick 1)",
    )
    p.add_argument(
        "--resume",
        metavar="CHECKPOINT",
        help="run every stage from a copy of this Pong checkpoint (its trained weights and epsilon): "
        "the speed late in training, where most actions are greedy",
    )
    return p


def resume_info(path: str | None) -> dict:
    """What the stages resume from: the checkpoint's path, stage, frame and epsilon (UsageError
    unless it is an unsolved Pong checkpoint of this project)."""
    if path is None:
        return {"resume": None, "start_frame": 0, "start_epsilon": 1.0}
    ckpt = load_checkpoint(path)
    if ckpt.get("game") != "pong":
        raise UsageError(f"--resume {path}: the bench runs Pong; this checkpoint is for {ckpt.get('game')!r}")
    stop = ckpt["params"]["stop_reward"]
    if RewardTracker(None, stop, rewards=ckpt.get("rewards")).solved:
        raise UsageError(
            f"--resume {path}: that run is solved already (mean of the last 100 games > {stop:g}), so every "
            "stage would stop at its first game; take a checkpoint from before the solve"
        )
    return {
        "resume": os.path.abspath(path),
        "resume_stage": ckpt.get("stage"),
        "start_frame": int(ckpt["frame_idx"]),
        "start_epsilon": float(ckpt.get("epsilon", 0.0)),
    }


def resolve_settings(args, cuda: bool) -> dict:
    """The run's settings, defaults filled in for the device (``cuda``: the resolved device is CUDA)."""
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag):
        raise UsageError(f"--tag {args.tag!r}: use letters, digits, '.', '_' and '-' only")
    if args.replay_initial > GAMES["pong"].replay_size:
        size = GAMES["pong"].replay_size
        raise UsageError(f"--replay-initial {args.replay_initial} is larger than the replay size {size}")
    try:
        stages = parse_stages(args.stages)
    except ValueError as e:
        raise UsageError(f"--stages: {e}")
    frames, bound_seconds, repeat = DEFAULTS[(cuda, args.quick)]
    frames = args.frames or frames
    return {
        "device": "cuda" if cuda else "cpu",
        "quick": args.quick,
        "repeat": args.repeat or repeat,
        "frames": frames,
        "sweep_frames": args.sweep_frames or max(1, frames // 2),
        "replay_initial": args.replay_initial,
        "stages": stages,
        "sweep": not args.no_sweep,
        "seed": args.seed,
        "envs": args.envs or KNOBS["envs"].resolve(KNOBS["envs"].default, "cuda" if cuda else "cpu"),  # the stages' own
        "steps": KNOBS["steps"].default,  # N where a stage has the knob: its default, the article's N
        "precision": KNOBS["precision"].resolve(args.precision, "cuda" if cuda else "cpu"),  # auto: this device's
        "bound_seconds": args.bound_seconds or bound_seconds,
        "out": args.out or OUT["quick" if args.quick else "full"],
        **resume_info(args.resume),
    }


def setup(argv: list[str]) -> tuple[dict, dict]:
    """Parse and check everything; (settings, meta). UsageError for bad input; creates nothing."""
    args = make_parser().parse_args(argv)
    device = cli.resolve_device(args.device).type
    settings = resolve_settings(args, device == "cuda")
    scripts.require_scripts("the bench")
    cli.check_writable_dir(settings["out"], "--out")
    hw = machine.hardware(device)
    tag = args.tag or (
        machine.default_tag(device, hw["cpu"], hw["cores"], hw["gpu"], hw["isa"])
        + ("-quick" if args.quick else "")
        + ("-resumed" if settings["resume"] else "")
    )
    measured = (settings["replay_initial"], settings["frames"], settings["start_frame"])
    meta = {
        "tag": tag,
        "command": machine.command_line(argv),
        "argv": argv,
        "cwd": os.getcwd(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": cli.git_commit(),
        "hardware": hw,
        "versions": machine.versions(),
        "settings": {**settings, "malloc": malloc_setting()},
        "load_average": {"start": machine.load_average()},
        "status": "running",
        "wall_seconds": 0.0,
        "bounds": {"greedy": greedy_fraction(*measured), "greedy_any": greedy_fraction(*measured, settings["envs"])},
    }
    return settings, meta


def bound_text(measured: dict) -> str:
    """'42.1 f/s (40.3-44.0) (env_old 1334.9/s (1301.2-1350.0), ...)': the bound, each part, their spreads."""

    def figure(value, low_high, unit):
        return f"{value:.1f}{unit}" + ("" if low_high[0] is None else f" ({low_high[0]:.1f}-{low_high[1]:.1f})")

    spreads = measured.get("spreads", {})
    rates = ", ".join(
        f"{name} {figure(rate, spreads.get(name, (None, None)), '/s')}" for name, rate in measured["parts"].items()
    )
    fps = (
        "none"
        if measured["fps"] is None
        else figure(measured["fps"], (measured["fps_low"], measured["fps_high"]), " f/s")
    )
    unsteady = f"; NOT TRUSTED: {', '.join(measured['unsteady'])} unsteady" if measured.get("unsteady") else ""
    return f"{fps} ({rates}){unsteady}"


def bound_measurer(settings: dict, greedy: dict, log):
    """spec -> the stage's parts measured now, and its bound in f/s (``bounds.bound_spread``)."""
    meter = None

    def measure(spec: dict) -> dict:
        nonlocal meter
        try:
            meter = meter or parts.PartMeter(settings)
        except parts.PART_ERRORS as e:
            error = f"{type(e).__name__}: {e}".splitlines()[0]
            log(f"{spec['prefix']}: bounds FAILED ({error})")
            return {"parts": {}, "errors": {"setup": error}, "fps": None, "fps_low": None, "fps_high": None}
        measured = meter.measure(spec["stage"], log=log)
        form = meter.form(spec["stage"])
        measured.update(bound_spread(form, measured, greedy["greedy"], greedy["greedy_any"], settings["envs"]))
        log(f"{spec['prefix']}: bound {bound_text(measured)}")
        return measured

    return measure


def announce(settings: dict, meta: dict, runs: list[dict], out_dir: str, log) -> None:
    s = settings
    log(
        f"{PROG}: {meta['tag']} on {s['device']}: {s['repeat']} round(s), {len(runs)} runs one at a time "
        f"({s['replay_initial']} warm-up + {s['frames']} frames"
        + (f", sweep {s['sweep_frames']}" if s["sweep"] else "")
        + f"), each stage after its bound's parts ({s['bound_seconds']:g} s each); results to {out_dir}"
    )
    cores, load = meta["hardware"]["cores"], meta["load_average"]["start"]
    if load is not None and load > 0.5 * cores:
        log(f"{PROG}: warning: load average {load:.1f} on {cores} cores: other work will slow the stages down")


def _on_sigterm(signum, frame):
    raise Terminated()


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m {seconds % 60:04.1f}s"


def execute(settings: dict, meta: dict, runs: list[dict], records: list[dict], log) -> int:
    """Run the plan; the exit code for an interrupt (records keep what was collected), else 0."""
    tmp = tempfile.mkdtemp(prefix="dqn-bench-")

    def launch_one(spec):
        run_dir = os.path.join(tmp, f"{spec['index']:02d}-r{spec['round']}-{spec['stage']}-N{spec['steps']}")
        return launch.run_stage(spec, settings, run_dir, log=log)

    try:
        rounds.run_rounds(runs, launch_one, bound_measurer(settings, meta["bounds"], log), records)
        meta["status"] = "complete"
        return EXIT_OK
    except (KeyboardInterrupt, Terminated) as exc:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the writing short
        meta["status"] = "interrupted"
        log(f"\n{PROG}: interrupted; writing what was collected")
        return EXIT_SIGINT if isinstance(exc, KeyboardInterrupt) else EXIT_SIGTERM
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _main(argv: list[str]) -> int:
    started = time.perf_counter()
    try:
        settings, meta = setup(argv)
    except UsageError as e:
        return cli.usage_exit(PROG, e)
    out_dir = os.path.join(settings["out"], meta["tag"])
    made = not os.path.isdir(out_dir)
    try:
        os.makedirs(out_dir, exist_ok=True)
        lock = runlock.claim(out_dir, f"--out {settings['out']}", kind="bench")  # as a run holds its folder
    except UsageError as e:
        return cli.usage_exit(PROG, e)
    except OSError as e:
        return cli.usage_exit(PROG, UsageError(f"--out {settings['out']}: cannot create {out_dir} ({e.strerror})"))
    try:
        return _bench(settings, meta, out_dir, started)
    finally:
        lock.release()
        if made:  # a bench that ended before writing anything (a failing bound) leaves no folder behind
            with contextlib.suppress(OSError):
                os.rmdir(out_dir)


def _bench(settings: dict, meta: dict, out_dir: str, started: float) -> int:
    runs = rounds.plan_runs(settings)
    log = lambda line: print(line, flush=True)
    announce(settings, meta, runs, out_dir, log)
    records = []
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C works in background jobs too
    try:
        code = execute(settings, meta, runs, records, log)
        records = rounds.all_records(runs, records, interrupted=meta["status"] == "interrupted")
        meta["wall_seconds"] = round(time.perf_counter() - started, 1)
        meta["load_average"]["end"] = machine.load_average()
        written = report.write_results(out_dir, meta, records)
        for line in report.console_table(records):
            log(line)
        if settings["repeat"] == 1:
            log(
                f"{PROG}: one round, so these figures carry no spread over rounds (a bound has its own, from its "
                "parts' windows); --repeat 3 shows how much they move"
            )
        log(f"{PROG}: wrote {', '.join(written)} to {out_dir}")
        log(f"{PROG}: total wall time {_minutes(meta['wall_seconds'])}")
    finally:
        signal.signal(signal.SIGTERM, old_term)
        signal.signal(signal.SIGINT, old_int)
    if code == EXIT_OK and any(r["status"] == "failed" for r in records):
        code = EXIT_FAILED
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = _main(argv)
    if code:
        sys.exit(code)
    return 0
