"""The benchmark in one command: every stage, the play-steps sweep, and this machine's bounds.

``python -m lib.bench [--quick] [--device auto|cpu|cuda] [--stages 01,05] [--no-sweep] ...``

1. Bounds, measured in this process on the chosen device: the rate of each part of a stage
   (env steps of each wrapper set and of stage 07's vector env, greedy acting, sampling a
   batch from a full replay buffer, one train step in fp32 and in stage 06's bf16 form), and
   from them the best f/s each stage could reach here (formulas in ``stage_bounds``).
2. The stages, run one after the other as subprocesses of this Python (never in parallel:
   they must not share the cores), each for --replay-initial warm-up transitions and then
   --frames training frames (agent steps). A stage's figure is its steady-state training
   speed after the buffer filled, from the run's summary.json.
3. The sweep: stage 02 with --steps 1..6 (--sweep-frames each), the article's second table.

Everything goes to ``<out>/<tag>/``: fps.csv, sweep.csv, bounds.csv, meta.json, a Markdown
report (README.md) with the article's figures beside ours, and two charts (ratios.png,
sweep.png). A failed stage is recorded with its last stderr line and the bench goes on (exit
code 1 at the end); Ctrl-C ends the running stage and writes what was collected (exit 130).
Bad flags end the program with one line on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import glob
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from lib.cli import positive as _positive_int

EXIT_USAGE = 2
EXIT_FAILED = 1
EXIT_SIGINT = 130
EXIT_SIGTERM = 143

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder of the stage scripts
STEPS = 4  # play steps per train step of stages 02-07 (their default; the article's choice)
BATCH = 32  # transitions per train step per play step (Hyperparams.batch_size)
PROGRESS_SEC = 5  # seconds between a stage's PROGRESS lines

# stage -> (script, short name)
STAGES = {
    "01": ("01_dqn_basic.py", "basic"),
    "02": ("02_play_steps.py", "play steps"),
    "03": ("03_parallel.py", "parallel"),
    "04": ("04_cuda_async.py", "cuda async"),
    "05": ("05_new_wrapper.py", "new wrappers"),
    "06": ("06_bf16_learner.py", "bf16 learner"),
    "07": ("07_vector_play.py", "vector play"),
}
# The article's figures (GTX 1080Ti, 2017), f/s. Stages 06 and 07 are not in it.
ARTICLE_FPS = {"01": 154, "02": 227, "03": 395, "04": 406, "05": 484}
ARTICLE_SWEEP = {1: 154, 2: 200, 3: 212, 4: 227, 5: 228, 6: 232}
ARTICLE_HW = "GTX 1080Ti, 2017"

# Per-part rates the bounds are built from: name -> unit. "K" is the stage-07 env count.
RATE_UNITS = {
    "env_old": "agent steps/s (old wrappers, random actions)",
    "env_new": "agent steps/s (new wrappers, random actions)",
    "env_vector": "agent steps/s (vector env, K envs, K per step)",
    "act_b1": "greedy actions/s (batch-1 forward, fp32)",
    "act_bK": "batched forwards/s (K states each, fp32)",
    "sample_b32": "batches/s (32 from a full replay buffer)",
    f"sample_b{BATCH * STEPS}": f"batches/s ({BATCH * STEPS} from a full replay buffer)",
    "train_fp32_b32": "train steps/s (fp32, batch 32)",
    f"train_fp32_b{BATCH * STEPS}": f"train steps/s (fp32, batch {BATCH * STEPS})",
    f"train_bf16_b{BATCH * STEPS}": f"train steps/s (stage-06 form, batch {BATCH * STEPS})",
}
_B = BATCH * STEPS
# The parts each stage's bound needs (so that --stages 01 measures only what 01 needs).
NEEDS = {
    "01": ("env_old", "act_b1", "sample_b32", "train_fp32_b32"),
    "02": ("env_old", "act_b1", f"sample_b{_B}", f"train_fp32_b{_B}"),
    "03": ("env_old", "act_b1", f"sample_b{_B}", f"train_fp32_b{_B}"),
    "04": ("env_old", "act_b1", f"sample_b{_B}", f"train_fp32_b{_B}"),
    "05": ("env_new", "act_b1", f"sample_b{_B}", f"train_fp32_b{_B}"),
    "06": ("env_new", "act_b1", f"sample_b{_B}", f"train_bf16_b{_B}"),
    "07": ("env_vector", "act_bK", f"sample_b{_B}", f"train_bf16_b{_B}"),
}
BOUND_FORMULAS = {
    "01": "1 / (t_env_old + g·t_act1 + t_sample(32) + t_train_fp32(32))",
    "02": f"1 / (t_env_old + g·t_act1 + (t_sample({_B}) + t_train_fp32({_B})) / {STEPS})",
    "03": f"min(1 / (t_env_old + g·t_act1), {STEPS} / (t_sample({_B}) + t_train_fp32({_B})))",
    "04": f"min(1 / (t_env_old + g·t_act1), {STEPS} / (t_sample({_B}) + t_train_fp32({_B})))",
    "05": f"min(1 / (t_env_new + g·t_act1), {STEPS} / (t_sample({_B}) + t_train_fp32({_B})))",
    "06": f"min(1 / (t_env_new + g·t_act1), {STEPS} / (t_sample({_B}) + t_train_bf16({_B})))",
    "07": f"min(K / (t_vec_step + g_K·t_actK), {STEPS} / (t_sample({_B}) + t_train_bf16({_B})))",
}

FPS_COLUMNS = [
    "stage", "name", "fps", "ratio_to_01", "article_fps", "article_ratio",
    "bound_fps", "efficiency", "train_frames", "seconds", "status",
]  # fmt: skip
SWEEP_COLUMNS = ["N", "fps", "ratio_to_N1", "article_fps", "article_ratio"]
OUTPUT_FILES = ("fps.csv", "sweep.csv", "bounds.csv", "README.md", "meta.json", "ratios.png", "sweep.png")


class UsageError(Exception):
    """Bad input: reported as one line, exit code 2."""


class Terminated(BaseException):
    """SIGTERM, handled like Ctrl-C."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise UsageError(message)


# -- command line --------------------------------------------------------------------------


def _positive_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    if not x > 0 or x == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return x


def parse_stages(text: str) -> list[str]:
    """'1,05, 7' -> ['01', '05', '07'] (sorted, no repeats); UsageError on anything else."""
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or f"{int(part):02d}" not in STAGES:
            raise UsageError(f"--stages: unknown stage {part!r} (known: {','.join(STAGES)})")
        out.add(f"{int(part):02d}")
    return sorted(out)


def make_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="dqn-bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="auto: CUDA when available")
    p.add_argument("--quick", action="store_true", help="small budgets: about 5 minutes on a 2-core CPU")
    help_frames = "training frames per stage after warm-up (CPU 4000, CUDA 20000; --quick 600, 4000)"
    p.add_argument("--frames", type=_positive_int, help=help_frames)
    p.add_argument("--sweep-frames", type=_positive_int, help="training frames per sweep run (default: --frames / 2)")
    p.add_argument("--replay-initial", type=_positive_int, default=1000, help="warm-up transitions before training")
    p.add_argument("--stages", default=",".join(STAGES), help="comma-separated stages to run (default: all)")
    p.add_argument("--no-sweep", action="store_true", help="skip the stage-02 --steps 1..6 sweep")
    p.add_argument("--out", default="results", help="results root; the bench writes <out>/<tag>/")
    p.add_argument("--tag", help="results folder name (default: from the CPU or GPU model, plus -quick with --quick)")
    p.add_argument("--seed", type=int, default=0, help="seed of every run")
    p.add_argument("--envs", type=_positive_int, help="stage 07's envs K (default 4 on CPU, 16 on CUDA)")
    p.add_argument("--bound-seconds", type=_positive_float, help="seconds per bound measurement (10, quick 3)")
    p.add_argument("--resume", metavar="CHECKPOINT",
                   help="run every stage from a copy of this Pong checkpoint (its trained weights and epsilon): "
                        "the speed late in training, where most actions are greedy")  # fmt: skip
    return p


def resolve_settings(args, cuda: bool) -> dict:
    """The run's settings, defaults filled in for the device (``cuda``: the resolved device is CUDA)."""
    if args.seed < 0:
        raise UsageError(f"--seed: expected a number >= 0, got {args.seed}")
    if args.tag is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", args.tag):
        raise UsageError(f"--tag {args.tag!r}: use letters, digits, '.', '_' and '-' only")
    from lib.params import GAMES

    if args.replay_initial > GAMES["pong"].replay_size:
        size = GAMES["pong"].replay_size
        raise UsageError(f"--replay-initial {args.replay_initial} is larger than the replay size {size}")
    resume = _resume_info(args.resume) if args.resume else {"resume": None, "start_frame": 0, "start_epsilon": 1.0}
    if cuda:
        frames = args.frames or (4000 if args.quick else 20000)
    else:
        frames = args.frames or (600 if args.quick else 4000)
    return {
        "device": "cuda" if cuda else "cpu",
        "quick": args.quick,
        "frames": frames,
        "sweep_frames": args.sweep_frames or max(1, frames // 2),
        "replay_initial": args.replay_initial,
        "stages": parse_stages(args.stages),
        "sweep": not args.no_sweep,
        "seed": args.seed,
        "envs": args.envs or (16 if cuda else 4),
        "steps": STEPS,
        "bound_seconds": args.bound_seconds or (3.0 if args.quick else 10.0),
        "out": args.out,
        **resume,
    }


def _resume_info(path: str) -> dict:
    """What the stages resume from: the checkpoint's path, frame and epsilon (UsageError if it
    is not a Pong checkpoint of this project)."""
    from lib.runner import UsageError as RunnerUsageError, load_checkpoint
    from lib.tracking import RewardTracker

    try:
        ckpt = load_checkpoint(path)
    except RunnerUsageError as e:
        raise UsageError(str(e))
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


def _check_writable_dir(path: str) -> None:
    from lib.cli import UsageError as RunnerUsageError, check_writable_dir

    try:
        check_writable_dir(path, "--out")
    except RunnerUsageError as e:
        raise UsageError(str(e))


# -- machine tag and metadata ---------------------------------------------------------------


def slugify(text: str) -> str:
    """'Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz' -> 'intel-xeon-gold-6338'."""
    text = text.lower().split("@")[0]
    text = re.sub(r"\((r|tm|c)\)|[®™©]", " ", text)
    words = [w for w in re.split(r"[^a-z0-9]+", text) if w and w not in ("cpu", "processor")]
    return "-".join(words) or "unknown"


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def default_tag(device: str, cpu_name: str, cores: int, gpu_name: str | None = None) -> str:
    if device == "cuda":
        return f"gpu-{slugify(gpu_name or 'cuda')}"
    return f"cpu-{slugify(cpu_name)}-{cores}c"


def memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def git_commit(root: str = ROOT) -> str:
    """Short hash, '-dirty' when tracked files changed or files outside results/ are untracked."""
    try:
        def git(*args):
            return subprocess.run(["git", "-C", root, *args], capture_output=True, text=True, timeout=10)

        head = git("rev-parse", "--short", "HEAD")
        if head.returncode != 0:
            return "unknown"
        status = git("status", "--porcelain")
        changed = [line for line in status.stdout.splitlines() if line[3:] and not line[3:].startswith("results/")]
        return head.stdout.strip() + ("-dirty" if changed else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    import ale_py
    import cv2
    import gymnasium
    import numpy
    import torch

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "gymnasium": gymnasium.__version__,
        "ale-py": ale_py.__version__,
        "numpy": numpy.__version__,
        "opencv": cv2.__version__,
    }


def command_line(argv: list[str]) -> str:
    prog = "dqn-bench" if os.path.basename(sys.argv[0]) == "dqn-bench" else "python -m lib.bench"
    return " ".join([prog] + ([shlex.join(argv)] if argv else []))


# -- stage output ---------------------------------------------------------------------------


def parse_kv(line: str, prefix: str) -> dict | None:
    """'PREFIX a=1 b=x' -> {'a': '1', 'b': 'x'}; None if the line is not one of those."""
    parts = line.strip().split()
    if not parts or parts[0] != prefix:
        return None
    return dict(p.split("=", 1) for p in parts[1:] if "=" in p)


def parse_result_line(line: str) -> dict | None:
    kv = parse_kv(line, "RESULT")
    if kv is None:
        return None
    out = dict(kv)
    for key in ("frames",):
        if key in kv:
            out[key] = int(kv[key])
    for key in ("seconds", "fps", "mean_reward"):
        if key in kv:
            out[key] = float(kv[key])  # 'nan' parses too
    out["solved"] = kv.get("solved") == "yes"
    return out


def parse_progress_line(line: str) -> dict | None:
    kv = parse_kv(line, "PROGRESS")
    if kv is None:
        return None
    try:
        return {"stage": kv.get("stage"), "frame": int(kv["frame"]), "phase": kv.get("phase"), "fps": float(kv["fps"])}
    except (KeyError, ValueError):
        return None


def progress_text(prefix: str, progress: dict, max_frames: int) -> str:
    head = f"{prefix}: frame {progress['frame']}/{max_frames}"
    if progress["phase"] == "train":
        return f"{head} train {progress['fps']:.1f} f/s"
    return f"{head} filling the replay buffer"


def find_summary(run_dir: str) -> dict | None:
    paths = sorted(glob.glob(os.path.join(run_dir, "*", "summary.json")))
    if not paths:
        return None
    try:
        with open(paths[-1]) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def _leader_exited(pid: int) -> bool:
    """The process exited (not reaped, so its pid and process group id stay reserved)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _end_group(proc, terminate: bool, grace: float = 10.0) -> None:
    """Reap the stage and leave nothing of its process group running. ``terminate``: SIGTERM
    the group first (the stage ends its play process and writes its summary) and SIGKILL it
    after ``grace`` seconds; otherwise wait for the stage to exit on its own. Either way, play
    processes still alive after the stage exited are killed."""
    if terminate and not _leader_exited(proc.pid):
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while not _leader_exited(proc.pid):
        if terminate and time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers only, once the leader exited
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()


def run_stage(spec: dict, settings: dict, run_dir: str, log=print) -> dict:
    """Run one stage as a subprocess and return its record. KeyboardInterrupt/Terminated
    end the child first, then propagate with the record in ``exc.record``."""
    script, _ = STAGES[spec["stage"]]
    max_frames = settings.get("start_frame", 0) + settings["replay_initial"] + spec["frames"]
    if settings.get("resume"):
        # A stage writes its logs next to the checkpoint it resumes: each gets its own copy.
        copy = os.path.join(run_dir, "resumed", "checkpoint.pt")
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copyfile(settings["resume"], copy)
        where = ["--resume", copy]
    else:
        where = ["--run-dir", run_dir]
    cmd = [
        sys.executable, os.path.join(ROOT, script), "--device", settings["device"], "--seed", str(settings["seed"]),
        "--replay-initial", str(settings["replay_initial"]), "--max-frames", str(max_frames),
        *where, "--quiet", "--progress", str(PROGRESS_SEC),
    ] + spec["args"]  # fmt: skip
    record = {
        "stage": spec["stage"], "label": spec["label"], "steps": spec.get("steps"), "fps": None,
        "train_frames": None, "frames": None, "seconds": None, "status": "failed", "error": None,
    }  # fmt: skip
    prefix = f"[{spec['index']}/{spec['total']}] {spec['label']}"
    log(f"{prefix}: start, {settings['replay_initial']} warm-up + {spec['frames']} training frames")
    os.makedirs(run_dir, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    result = None
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, text=True, env=env,
            start_new_session=True,  # its own process group: Ctrl-C reaches the bench, which ends the group
        )  # fmt: skip
        try:
            for line in proc.stdout:
                progress = parse_progress_line(line)
                if progress is not None:
                    log(progress_text(prefix, progress, max_frames))
                result = parse_result_line(line) or result
            _end_group(proc, terminate=False)
        except BaseException as exc:
            _end_group(proc, terminate=True)
            record.update(status="interrupted", error=type(exc).__name__)
            _fill_record(record, result, find_summary(run_dir))
            exc.record = record
            raise
        finally:
            proc.stdout.close()
        err.seek(0)
        err_lines = [line.strip() for line in err.read().splitlines() if line.strip()]
    summary = find_summary(run_dir)
    _fill_record(record, result, summary)
    if proc.returncode != 0:
        record["error"] = err_lines[-1] if err_lines else f"exit code {proc.returncode}"
    elif result is None and summary is None:
        record["error"] = "no RESULT line"
    elif not record["train_frames"]:
        record["error"] = "no training frames (the run ended before the buffer filled)"
    else:
        record["status"] = "ok"
    wall = time.perf_counter() - started
    if record["status"] == "ok":
        log(f"{prefix}: {record['fps']:.1f} f/s over {record['train_frames']} training frames ({wall:.0f} s)")
    else:
        log(f"{prefix}: FAILED ({record['error']})")
    return record


def _fill_record(record: dict, result: dict | None, summary: dict | None) -> None:
    if result:
        record.update(fps=result.get("fps"), frames=result.get("frames"), seconds=result.get("seconds"))
    if summary:
        record.update(
            fps=summary.get("fps"), frames=summary.get("frames"), train_frames=summary.get("train_frames"),
            seconds=summary.get("seconds"),
        )  # fmt: skip


def plan_runs(settings: dict) -> list[dict]:
    """The stage runs in order: the selected stages, then the sweep."""
    runs = []
    for stage in settings["stages"]:
        args, label = [], f"stage {stage}"
        if stage != "01":
            args, label = ["--steps", str(STEPS)], f"stage {stage} N={STEPS}"
        if stage == "07":
            args += ["--envs", str(settings["envs"])]
            label += f" K={settings['envs']}"
        runs.append({"kind": "stage", "stage": stage, "label": label, "args": args, "frames": settings["frames"],
                     "steps": 1 if stage == "01" else STEPS})  # fmt: skip
    if settings["sweep"]:
        for n in ARTICLE_SWEEP:
            runs.append({"kind": "sweep", "stage": "02", "label": f"sweep 02 N={n}", "args": ["--steps", str(n)],
                         "frames": settings["sweep_frames"], "steps": n})  # fmt: skip
    for i, spec in enumerate(runs, start=1):
        spec.update(index=i, total=len(runs))
    return runs


# -- bounds ---------------------------------------------------------------------------------


def greedy_fraction(replay_initial: int, frames: int, start: int = 0, envs: int = 1) -> float:
    """Share of the measured training frames (start + replay_initial, start + replay_initial +
    frames] that act greedily (1 - epsilon); only those run the batch-1 forward pass in stages
    01-06. ``start``: the frame of the checkpoint the stages resume from (--resume).
    ``envs`` K > 1: the share of stage 07's vector steps where at least one of the K envs acts
    greedily (1 - epsilon^K), the only ones that run its batched forward pass."""
    from lib.params import GAMES
    from lib.tracking import epsilon_at

    params = GAMES["pong"]
    first = start + replay_initial + 1
    total = sum(1.0 - epsilon_at(f, params) ** envs for f in range(first, first + frames))
    return total / frames


def stage_bounds(rates: dict, envs: int, greedy: float = 1.0, steps: int = STEPS, greedy_any: float = 1.0) -> dict:
    """Best f/s of each stage from per-part rates (see RATE_UNITS); None where a part is missing.

    t_x = 1 / rate_x. Serial stages pay every part in turn, per frame; the parallel stages
    (03+) play in one process and train in another, so the slower side sets the pace.
    ``greedy``: share of frames whose action comes from the net (the rest are random and skip
    the forward pass); ``greedy_any``: share of stage 07's vector steps with at least one
    greedy env, the only ones that run its batched forward pass.
    """
    b = BATCH * steps
    t = {name: 1.0 / rate for name, rate in rates.items() if rate and rate > 0}

    def get(*names):
        return None if any(n not in t for n in names) else [t[n] for n in names]

    out = {}
    p = get("env_old", "act_b1", "sample_b32", "train_fp32_b32")
    out["01"] = None if p is None else 1.0 / (p[0] + greedy * p[1] + p[2] + p[3])
    p = get("env_old", "act_b1", f"sample_b{b}", f"train_fp32_b{b}")
    out["02"] = None if p is None else 1.0 / (p[0] + greedy * p[1] + (p[2] + p[3]) / steps)
    for stage, env, train in (("03", "env_old", "fp32"), ("04", "env_old", "fp32"), ("05", "env_new", "fp32"),
                              ("06", "env_new", "bf16")):  # fmt: skip
        p = get(env, "act_b1", f"sample_b{b}", f"train_{train}_b{b}")
        out[stage] = None if p is None else min(1.0 / (p[0] + greedy * p[1]), steps / (p[2] + p[3]))
    p = get("env_vector", "act_bK", f"sample_b{b}", f"train_bf16_b{b}")
    out["07"] = None if p is None else min(envs / (envs * p[0] + greedy_any * p[1]), steps / (p[2] + p[3]))
    return out


def measure_rate(fn, seconds: float, sync=None) -> float:
    """Calls of ``fn`` per second over ``seconds`` of wall time, after a short warm-up;
    ``sync`` (CUDA) runs before each reading of the clock, so queued work is counted."""
    sync = sync or (lambda: None)
    warm_until = time.perf_counter() + min(1.0, 0.2 * seconds)
    n = 0
    while n < 2 or time.perf_counter() < warm_until:
        fn()
        n += 1
    sync()
    t0 = time.perf_counter()
    n = 0
    while True:
        fn()
        n += 1
        if time.perf_counter() - t0 >= seconds:
            break
    sync()
    return n / (time.perf_counter() - t0)


def measure_bounds(settings: dict, names: list[str], log=print, into: dict | None = None) -> dict:
    """Measure the named per-part rates in this process on the chosen device. Results go into
    ``into`` as they come (so an interrupt keeps them): {"rates": .., "errors": ..}."""
    import numpy as np
    import torch
    import torch.optim as optim

    from lib import parallel, wrappers
    from lib.agent import choose_action, choose_actions
    from lib.buffer import ReplayBuffer
    from lib.loss import calc_loss
    from lib.model import DQN, fast_adam_options
    from lib.params import GAMES

    out = into if into is not None else {}
    out.setdefault("rates", {})
    out.setdefault("errors", {})
    params = GAMES["pong"]
    device = torch.device(settings["device"])
    seconds, seed, envs = settings["bound_seconds"], settings["seed"], settings["envs"]
    sync = torch.cuda.synchronize if device.type == "cuda" else None
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    probe = wrappers.make_env(params.env_name)
    shape, n_actions, action_space = probe.observation_space.shape, probe.action_space.n, probe.action_space
    probe.close()
    pool = rng.integers(0, 256, (64,) + shape[1:], dtype=np.uint8)  # frame contents do not change the cost

    def random_batch(size):
        return (
            rng.integers(0, 256, (size,) + shape, dtype=np.uint8),
            rng.integers(0, n_actions, size).astype(np.int64),
            rng.choice(np.array([-1.0, 0.0, 1.0], dtype=np.float32), size),
            rng.random(size) < 0.01,
            rng.integers(0, 256, (size,) + shape, dtype=np.uint8),
        )

    def env_rate(new_wrappers):
        env = wrappers.make_env(params.env_name, new_wrappers=new_wrappers)
        env.action_space.seed(seed)
        env.reset(seed=seed)

        def step():
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                env.reset()

        try:
            return measure_rate(step, seconds)
        finally:
            env.close()

    def vector_rate():
        _, player_threads = parallel.split_threads(device)
        venv = wrappers.make_vector_env(params.env_name, envs, threads=min(player_threads, envs))
        venv.reset(seed=seed)
        try:
            return envs * measure_rate(lambda: venv.step(rng.integers(0, n_actions, envs)), seconds)
        finally:
            venv.close()

    def act_rate(batch):
        if batch == 1:
            net = DQN(shape, n_actions).to(device)
            state = random_batch(1)[0][0]
            return measure_rate(lambda: choose_action(net, state, 0.0, action_space, device), seconds, sync)
        net = DQN(shape, n_actions).to(device, memory_format=torch.channels_last)  # as stage 07's play process
        states = random_batch(batch)[0]
        return measure_rate(lambda: choose_actions(net, states, 0.0, n_actions, device, rng), seconds, sync)

    buffer = None

    def sample_rate(batch):
        nonlocal buffer
        if buffer is None:  # a full ring of the stages' size, episodes of 1000 transitions
            buffer = ReplayBuffer(params.replay_size, shape[1:], shape[0], seed=seed)
            buffer.start_episode(pool[: shape[0]])
            for i in range(params.replay_size):
                done = i % 1000 == 999
                buffer.add_step(i % n_actions, 0.0, done, pool[i % len(pool)], done)
                if done:
                    buffer.start_episode(pool[: shape[0]])
        return measure_rate(lambda: buffer.sample(batch), seconds)

    def train_rate(batch, form):
        fast = form == "bf16"
        memory_format = torch.channels_last if fast else torch.contiguous_format
        net = DQN(shape, n_actions).to(device, memory_format=memory_format)
        tgt_net = DQN(shape, n_actions).to(device, memory_format=memory_format)
        tgt_net.load_state_dict(net.state_dict())
        options = fast_adam_options(device) if fast else {}
        optimizer = optim.Adam(net.parameters(), lr=params.learning_rate, **options)
        data = random_batch(batch)
        if fast and device.type == "cuda":  # stage 06 samples into pinned buffers, copies non-blocking
            data = tuple(torch.from_numpy(a).pin_memory() for a in data)

        def step():
            optimizer.zero_grad()
            if fast:
                with torch.autocast(device.type, dtype=torch.bfloat16):
                    loss_v = calc_loss(data, net, tgt_net, params.gamma, device, non_blocking=True,
                                       channels_last=True, inference_target=True)  # fmt: skip
            else:
                loss_v = calc_loss(data, net, tgt_net, params.gamma, device)
            loss_v.backward()
            optimizer.step()

        return measure_rate(step, seconds, sync)

    measures = {
        "env_old": lambda: env_rate(False),
        "env_new": lambda: env_rate(True),
        "env_vector": vector_rate,
        "act_b1": lambda: act_rate(1),
        "act_bK": lambda: act_rate(envs),
    }
    for name in RATE_UNITS:
        kind, _, size = name.rpartition("_b")
        if kind == "sample":
            measures[name] = lambda size=int(size): sample_rate(size)
        elif kind.startswith("train_"):
            measures[name] = lambda size=int(size), form=kind[6:]: train_rate(size, form)
    try:
        for name in names:
            try:
                out["rates"][name] = measures[name]()
                log(f"[bounds] {name}: {out['rates'][name]:.1f} {RATE_UNITS[name].replace('K', str(envs))}")
            except Exception as e:  # a part that cannot be measured leaves its stages unbounded
                out["errors"][name] = f"{type(e).__name__}: {e}".splitlines()[0]
                log(f"[bounds] {name}: FAILED ({out['errors'][name]})")
    finally:
        buffer = None
    return out


def needed_rates(stages: list[str]) -> list[str]:
    """The per-part rates the selected stages' bounds need, in RATE_UNITS order."""
    wanted = {name for stage in stages for name in NEEDS[stage]}
    return [name for name in RATE_UNITS if name in wanted]


# -- tables and reports ---------------------------------------------------------------------


def _ratio(a, b):
    return a / b if a is not None and b else None


def stage_table(records: list[dict], bounds: dict) -> list[dict]:
    """fps.csv rows from stage records ({stage, fps, train_frames, seconds, status, ...}) and
    stage bounds ({stage: f/s or None})."""
    base = next((r["fps"] for r in records if r["stage"] == "01" and r["status"] == "ok"), None)
    rows = []
    for r in records:
        fps = r["fps"] if r["status"] == "ok" else None
        article = ARTICLE_FPS.get(r["stage"])
        bound = bounds.get(r["stage"])
        rows.append({
            "stage": r["stage"],
            "name": STAGES[r["stage"]][1],
            "fps": fps,
            "ratio_to_01": _ratio(fps, base),
            "article_fps": article,
            "article_ratio": _ratio(article, ARTICLE_FPS["01"]),
            "bound_fps": bound,
            "efficiency": _ratio(fps, bound),
            "train_frames": r.get("train_frames"),
            "seconds": r.get("seconds"),
            "status": r["status"],
        })  # fmt: skip
    return rows


def sweep_table(records: list[dict]) -> list[dict]:
    base = next((r["fps"] for r in records if r["steps"] == 1 and r["status"] == "ok"), None)
    rows = []
    for r in records:
        fps = r["fps"] if r["status"] == "ok" else None
        article = ARTICLE_SWEEP.get(r["steps"])
        rows.append({"N": r["steps"], "fps": fps, "ratio_to_N1": _ratio(fps, base), "article_fps": article,
                     "article_ratio": _ratio(article, ARTICLE_SWEEP[1])})  # fmt: skip
    return rows


def _cell(value, digits: int = 2) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def write_csv(path: str, columns: list[str], rows: list[dict], digits: dict | None = None) -> None:
    digits = digits or {}
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([_cell(row.get(c), digits.get(c, 2)) for c in columns])


def bounds_rows(bounds: dict, envs: int) -> list[dict]:
    rows = [{"name": n, "value": v, "unit": RATE_UNITS[n].replace("K", str(envs))} for n, v in bounds["rates"].items()]
    if "greedy" in bounds:
        unit = "share of frames acting greedily (g)"
        rows.append({"name": "greedy_fraction", "value": bounds["greedy"], "unit": unit})
    if "greedy_any" in bounds:
        unit = f"share of stage 07's vector steps with a greedy env among {envs} (g_K)"
        rows.append({"name": "greedy_any_of_k", "value": bounds["greedy_any"], "unit": unit})
    for stage, value in bounds.get("stages", {}).items():
        if value is not None:
            rows.append({"name": f"bound_{stage}", "value": value, "unit": "f/s (best this stage could reach here)"})
    return rows


def _md(value, digits: int = 1, suffix: str = "", none: str = "—") -> str:
    return none if value is None else f"{value:.{digits}f}{suffix}"


def render_readme(meta: dict, fps_rows: list[dict], sweep_rows: list[dict] | None, bounds: dict,
                  records: list[dict]) -> str:  # fmt: skip
    s = meta["settings"]
    hw = meta["hardware"]
    load = meta.get("load_average", {})
    lines = [f"# DQN speed-up benchmark: {meta['tag']}", ""]
    if meta.get("status") == "interrupted":
        lines += ["**Interrupted: the figures below are what was collected before the stop.**", ""]
    gpu = f", GPU {hw['gpu']}" if hw.get("gpu") else ""
    lines += [
        f"- Command: `{meta['command']}`",
        f"- Date: {meta['date']}; total wall time {meta['wall_seconds'] / 60:.1f} min",
        f"- Commit: {meta['commit']}",
        f"- Hardware: {hw['cpu']}, {hw['cores']} cores, {_md(hw.get('memory_gib'), 1, ' GiB')} memory{gpu}; "
        f"device {s['device']}",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()),
        f"- Load average (1 min) at start and end: {_md(load.get('start'), 2)}, {_md(load.get('end'), 2)} "
        f"on {hw['cores']} cores (other work slows the stages down)",
        f"- Budgets: {s['replay_initial']} warm-up transitions, then {s['frames']} training frames per stage"
        + (f" and {s['sweep_frames']} per sweep run" if s["sweep"] else "")
        + f"; seed {s['seed']}; N={s['steps']} for stages 02-07, K={s['envs']} envs for 07; "
        f"{s['bound_seconds']:g} s per bound measurement",
    ]
    if s.get("resume"):
        lines.append(
            f"- Every stage resumed a copy of `{s['resume']}` (saved by stage {s.get('resume_stage')} at frame "
            f"{s['start_frame']}, epsilon {s['start_epsilon']:.2f}): trained weights, late-training speed"
        )
    lines += [
        "",
        "A frame is one agent step (4 emulator frames). f/s is the steady-state training speed after",
        "the replay buffer filled. The article's figures are from a "
        f"{ARTICLE_HW}; compare the ratios to stage 01, not the f/s.",
        "",
        "## Stages",
        "",
        "| stage | name | f/s | vs 01 | article f/s | article vs 01 | bound f/s | efficiency | train frames | s "
        "| status |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in fps_rows:
        lines.append(
            f"| {r['stage']} | {r['name']} | {_md(r['fps'])} | {_md(r['ratio_to_01'], 2)} | "
            f"{r['article_fps'] if r['article_fps'] is not None else '—'} | {_md(r['article_ratio'], 2)} | "
            f"{_md(r['bound_fps'])} | {_md(None if r['efficiency'] is None else 100 * r['efficiency'], 0, '%')} | "
            f"{r['train_frames'] if r['train_frames'] is not None else '—'} | {_md(r['seconds'])} | {r['status']} |"
        )
    lines += ["", "![Each stage as a ratio to stage 01, ours and the article's](ratios.png)", ""]
    failed = [r for r in records if r["status"] != "ok" and r.get("error")]
    if failed:
        lines += ["Failed or stopped runs:", ""]
        lines += [f"- {r['label']}: {r['status']}: `{r['error']}`" for r in failed]
        lines.append("")
    lines += ["## Play-steps sweep (stage 02, --steps N)", ""]
    if sweep_rows is None:
        lines += ["Not run (--no-sweep).", ""]
    else:
        lines += ["| N | f/s | vs N=1 | article f/s | article vs N=1 |", "|---|---|---|---|---|"]
        for r in sweep_rows:
            lines.append(
                f"| {r['N']} | {_md(r['fps'])} | {_md(r['ratio_to_N1'], 2)} | {r['article_fps']} | "
                f"{_md(r['article_ratio'], 2)} |"
            )
        lines += ["", "![f/s against N as a ratio to N=1, ours and the article's](sweep.png)", ""]
    lines += ["## Bounds", ""]
    envs = s["envs"]
    if bounds["rates"]:
        lines += ["Measured in the bench's own process on the same device, one part at a time:", "",
                  "| part | rate | unit | time per call |", "|---|---|---|---|"]  # fmt: skip
        for name, rate in bounds["rates"].items():
            lines.append(f"| {name} | {rate:.1f} | {RATE_UNITS[name].replace('K', str(envs))} | {1000 / rate:.3f} ms |")
        lines.append("")
    for name, error in bounds.get("errors", {}).items():
        lines.append(f"- {name}: not measured: `{error}`")
    if bounds.get("errors"):
        lines.append("")
    lines += [
        "Each stage's bound is the best f/s it could reach on this machine, from those parts",
        "(t_x = 1 / rate of x, per call; t_vec_step = K / env_vector rate):",
        "",
    ]
    lines += [f"- {stage}: `{BOUND_FORMULAS[stage]}`" for stage in s["stages"]]
    lines += [
        "",
        f"g = {_md(bounds.get('greedy'), 3)} is the share of the measured frames that act greedily (1 - epsilon):",
        *(
            ["resumed late in training, nearly every action comes from the net."]
            if s.get("resume")
            else ["short bench runs sit at the start of the epsilon schedule, where most actions are random",
                  "and skip the forward pass."]
        ),  # fmt: skip
        f"g_K = {_md(bounds.get('greedy_any'), 3)} is the share of stage 07's vector steps where at least one of its",
        f"K={envs} envs acts greedily (1 - epsilon^K): only those run its batched forward pass.",
        f"The training side is batch 32*N with N={s['steps']}. Efficiency = measured f/s / bound.",
        "The bounds leave out what ties the parts together: the Queue between the processes,",
        "target syncs, Python glue; and they assume the parts do not slow each other down.",
    ]
    if s["device"] == "cpu":
        lines += [
            f"On a CPU the parallel stages' two processes share the same {hw['cores']} cores, while each part",
            "was measured with all of them to itself, so the parallel bounds (03-07) are optimistic there.",
        ]
    lines.append("")
    return "\n".join(lines)


def draw_charts(out_dir: str, fps_rows: list[dict], sweep_rows: list[dict] | None, tag: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5))
    ax = fig.subplots()
    stages = [r["stage"] for r in fps_rows]
    width = 0.38
    for offset, key, label, color in ((-width / 2, "ratio_to_01", f"ours ({tag})", "tab:blue"),
                                      (width / 2, "article_ratio", f"article ({ARTICLE_HW})", "tab:gray")):  # fmt: skip
        xs = [i + offset for i, r in enumerate(fps_rows) if r[key] is not None]
        ys = [r[key] for r in fps_rows if r[key] is not None]
        bars = ax.bar(xs, ys, width, label=label, color=color)
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.set_xticks(range(len(stages)), [f"{r['stage']}\n{r['name']}" for r in fps_rows], fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_ylabel("f/s as a ratio to stage 01")
    ax.set_title("Speed-up of each stage over stage 01")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "ratios.png"), dpi=110)

    if sweep_rows is None:
        return
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    for key, label, style in (("ratio_to_N1", f"ours ({tag})", "o-"),
                              ("article_ratio", f"article ({ARTICLE_HW})", "s--")):  # fmt: skip
        pts = [(r["N"], r[key]) for r in sweep_rows if r[key] is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xlabel("play steps per train step N (batch 32*N)")
    ax.set_ylabel("f/s as a ratio to N=1")
    ax.set_title("Stage 02 play-steps sweep")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "sweep.png"), dpi=110)


def write_results(out_dir: str, meta: dict, stage_records: list[dict], sweep_records: list[dict] | None,
                  bounds: dict) -> list[str]:  # fmt: skip
    """Write the whole results folder; returns the files written. Files of an earlier run that
    this one does not produce are removed, so the folder never mixes two runs."""
    os.makedirs(out_dir, exist_ok=True)
    for name in OUTPUT_FILES:
        path = os.path.join(out_dir, name)
        if os.path.isfile(path):
            os.remove(path)
    envs = meta["settings"]["envs"]
    fps_rows = stage_table(stage_records, bounds.get("stages", {}))
    sweep_rows = None if sweep_records is None else sweep_table(sweep_records)
    write_csv(os.path.join(out_dir, "fps.csv"), FPS_COLUMNS, fps_rows,
              {"ratio_to_01": 3, "article_ratio": 3, "efficiency": 3, "seconds": 1})  # fmt: skip
    written = ["fps.csv"]
    if sweep_rows is not None:
        write_csv(os.path.join(out_dir, "sweep.csv"), SWEEP_COLUMNS, sweep_rows, {"ratio_to_N1": 3, "article_ratio": 3})
        written.append("sweep.csv")
    write_csv(os.path.join(out_dir, "bounds.csv"), ["name", "value", "unit"], bounds_rows(bounds, envs), {"value": 3})
    written.append("bounds.csv")
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(dict(meta, bounds=bounds, runs=stage_records + (sweep_records or [])), f, indent=2)
    written.append("meta.json")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(render_readme(meta, fps_rows, sweep_rows, bounds, stage_records + (sweep_records or [])))
    written.append("README.md")
    try:
        draw_charts(out_dir, fps_rows, sweep_rows, meta["tag"])
        written += ["ratios.png"] + (["sweep.png"] if sweep_rows is not None else [])
    except Exception as e:  # the tables matter more than the pictures
        print(f"dqn-bench: warning: charts not drawn: {type(e).__name__}: {e}", file=sys.stderr)
    return written


# -- main -----------------------------------------------------------------------------------


def _on_sigterm(signum, frame):
    raise Terminated()


def _load_average() -> float | None:
    """1-minute load average: other work on the machine skews every figure, so it is recorded."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m {seconds % 60:04.1f}s"


def _main(argv: list[str]) -> int:
    started = time.perf_counter()
    try:
        args = make_parser().parse_args(argv)
        import torch

        if args.device == "cuda" and not torch.cuda.is_available():
            raise UsageError("--device cuda: no CUDA device is available (use --device cpu)")
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        settings = resolve_settings(args, cuda)
        missing = [STAGES[s][0] for s in STAGES if not os.path.isfile(os.path.join(ROOT, STAGES[s][0]))]
        if missing:
            raise UsageError(f"stage scripts not found in {ROOT}: {', '.join(missing)}")
        _check_writable_dir(settings["out"])
    except UsageError as e:
        print(f"dqn-bench: error: {e}", file=sys.stderr)
        return EXIT_USAGE

    cores = os.cpu_count() or 1
    gpu = torch.cuda.get_device_name() if cuda else None
    tag = args.tag or (
        default_tag(settings["device"], cpu_model(), cores, gpu)
        + ("-quick" if args.quick else "")
        + ("-resumed" if settings["resume"] else "")
    )
    out_dir = os.path.join(settings["out"], tag)
    meta = {
        "tag": tag,
        "command": command_line(argv),
        "argv": argv,
        "cwd": os.getcwd(),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "commit": git_commit(),
        "hardware": {"cpu": cpu_model(), "cores": cores, "memory_gib": memory_gib(), "gpu": gpu},
        "versions": versions(),
        "settings": settings,
        "load_average": {"start": _load_average()},
        "status": "running",
        "wall_seconds": 0.0,
    }
    runs = plan_runs(settings)
    rate_names = needed_rates(settings["stages"])
    print(
        f"dqn-bench: {tag} on {settings['device']}: {len(rate_names)} bound measurements of "
        f"{settings['bound_seconds']:g} s, then {len(runs)} stage runs "
        f"({settings['replay_initial']} warm-up + {settings['frames']} frames"
        + (f", sweep {settings['sweep_frames']}" if settings["sweep"] else "")
        + f"), one at a time; results to {out_dir}",
        flush=True,
    )
    log = lambda line: print(line, flush=True)  # noqa: E731
    load = meta["load_average"]["start"]
    if load is not None and load > 0.5 * cores:
        log(f"dqn-bench: warning: load average {load:.1f} on {cores} cores: other work will slow the stages down")
    measured = (settings["replay_initial"], settings["frames"], settings["start_frame"])
    bounds = {"rates": {}, "errors": {}, "greedy": greedy_fraction(*measured),
              "greedy_any": greedy_fraction(*measured, envs=settings["envs"])}  # fmt: skip
    records = {id(spec): None for spec in runs}
    code = 0
    old_term = signal.signal(signal.SIGTERM, _on_sigterm)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C works in background jobs too
    tmp = tempfile.mkdtemp(prefix="dqn-bench-")
    try:
        try:
            measure_bounds(settings, rate_names, log=log, into=bounds)
        except Exception as e:  # no bounds is no reason to skip the stages
            bounds["errors"]["setup"] = f"{type(e).__name__}: {e}".splitlines()[0]
            log(f"[bounds] FAILED ({bounds['errors']['setup']})")
        bounds["stages"] = stage_bounds(
            bounds["rates"], settings["envs"], bounds["greedy"], greedy_any=bounds["greedy_any"]
        )
        for spec in runs:
            run_dir = os.path.join(tmp, f"{spec['index']:02d}-{spec['stage']}-N{spec['steps']}")
            records[id(spec)] = run_stage(spec, settings, run_dir, log=log)
        meta["status"] = "complete"
    except (KeyboardInterrupt, Terminated) as exc:
        code = EXIT_SIGINT if isinstance(exc, KeyboardInterrupt) else EXIT_SIGTERM
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the writing short
        meta["status"] = "interrupted"
        spec_record = getattr(exc, "record", None)
        if spec_record is not None:
            running = next(s for s in runs if records[id(s)] is None)
            records[id(running)] = spec_record
        print(f"\ndqn-bench: interrupted; writing what was collected to {out_dir}", flush=True)
    finally:
        signal.signal(signal.SIGTERM, old_term)
        shutil.rmtree(tmp, ignore_errors=True)
    bounds.setdefault(
        "stages", stage_bounds(bounds["rates"], settings["envs"], bounds["greedy"], greedy_any=bounds["greedy_any"])
    )

    def record_of(spec):
        return records[id(spec)] or {"stage": spec["stage"], "label": spec["label"], "steps": spec["steps"],
                                     "fps": None, "train_frames": None, "frames": None, "seconds": None,
                                     "status": "not run", "error": None}  # fmt: skip

    stage_records = [record_of(s) for s in runs if s["kind"] == "stage"]
    sweep_records = [record_of(s) for s in runs if s["kind"] == "sweep"] if settings["sweep"] else None
    meta["wall_seconds"] = round(time.perf_counter() - started, 1)
    meta["load_average"]["end"] = _load_average()
    written = write_results(out_dir, meta, stage_records, sweep_records, bounds)
    for row in stage_table(stage_records, bounds["stages"]):
        eff = "" if row["efficiency"] is None else f", {100 * row['efficiency']:.0f}% of bound {row['bound_fps']:.1f}"
        fps = "—" if row["fps"] is None else f"{row['fps']:.1f} f/s"
        print(f"  stage {row['stage']} {row['name']}: {fps}{eff} [{row['status']}]", flush=True)
    print(f"dqn-bench: wrote {', '.join(written)} to {out_dir}", flush=True)
    print(f"dqn-bench: total wall time {_minutes(meta['wall_seconds'])}", flush=True)
    signal.signal(signal.SIGINT, old_int)
    if code == 0 and any(r["status"] == "failed" for r in stage_records + (sweep_records or [])):
        code = EXIT_FAILED
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    code = _main(argv)
    if code:
        sys.exit(code)
    return 0


if __name__ == "__main__":
    main()
