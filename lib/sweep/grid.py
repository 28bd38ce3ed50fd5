"""The plan of a sweep: its runs (``RunSpec``) from the command line's stages, seeds, games and
stage flags, each run's state in the driver (``Job``), and what a run's folder says is finished.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex

from lib.params import GAMES
from lib.run.cli import UsageError
from lib.run.knobs import KNOBS
from lib.run.stage_args import make_parser
from lib.run.stages import STAGES, parse_stages

# Stage flags the sweep sets for every run, and what to do instead.
OWNED = {
    "seed": "use --seeds", "game": "use --games", "max_frames": "use --max-frames", "run_dir": "use --out",
    "resume": "a rerun resumes unfinished runs", "save_every": "use --save-every", "quiet": "it is always on",
    "progress": "use --progress", "device": "use --per-run-gpus", "cuda": "use --per-run-gpus",
    "save_replay": "the sweep's own --save-replay, on by default",
}  # fmt: skip
ACTIVE = ("waiting", "running")  # a Job handed to the pool, before and after its process started
STATUSES = ("queued", *ACTIVE, "done", "skipped", "failed", "interrupted")  # a Job's, as sweep.json records it


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """One run of the grid: everything a node needs to start it."""

    stage: str
    game: str
    seed: int
    max_frames: int | None
    save_every: int
    progress: float
    flags: tuple[str, ...]  # pass-through flags, already routed to this stage
    cpus: float
    gpus: float
    save_replay: bool = False  # checkpoints hold the replay ring (the driver turns it off where it does not fit)
    arm: str = ""  # the arm's name (``--arm``), whose flags are among ``flags``; "" without arms

    @property
    def key(self) -> str:
        return f"{self.stage}{'+' + self.arm if self.arm else ''}-{self.game}-seed{self.seed}"

    def argv(self) -> list[str]:
        """The stage's command line, less the script and the run folder."""
        out = ["--seed", str(self.seed), "--game", self.game]
        if self.max_frames is not None:
            out += ["--max-frames", str(self.max_frames)]
        out += ["--device", "cuda" if self.gpus > 0 else "cpu", "--save-every", str(self.save_every)]
        out += ["--quiet", "--progress", f"{self.progress:g}", *self.flags]
        return out + (["--save-replay"] if self.save_replay else [])


def parse_seeds(text: str) -> list[int]:
    """'0-4' -> [0..4]; '1,3,7-8' -> [1, 3, 7, 8]; UsageError on anything else or nothing."""
    seeds = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+)(?:\s*-\s*(\d+))?\s*", part)
        if not m:
            raise UsageError(f"--seeds {text!r}: expected N, A-B or a comma list of those")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo:
            raise UsageError(f"--seeds {text!r}: the range {lo}-{hi} is empty")
        if hi >= 2**31:
            raise UsageError(f"--seeds {text!r}: seeds must be below {2**31}")
        if hi - lo >= 10_000:
            raise UsageError(f"--seeds {text!r}: {hi - lo + 1} seeds is more than a sweep can hold")
        seeds.update(range(lo, hi + 1))
    return sorted(seeds)


def parse_games(text: str) -> list[str]:
    games = []
    for part in text.split(","):
        game = part.strip().lower()
        if game not in GAMES:
            raise UsageError(f"--games: unknown game {part.strip()!r} (known: {', '.join(GAMES)})")
        if game not in games:
            games.append(game)
    return games


def _flag_groups(flags: list[str]) -> list[list[str]]:
    """['--a', '1', '--b=2', '--c'] -> [['--a', '1'], ['--b=2'], ['--c']]."""
    groups: list[list[str]] = []
    for token in flags:
        if token.startswith("--"):
            groups.append([token])
        elif token.startswith("-") and not re.fullmatch(r"-[\d.]+", token):
            raise UsageError(f"-- {token}: stage flags are long flags (--name)")
        elif not groups:
            raise UsageError(f"-- {token}: expected a stage flag (--name) after --")
        else:
            groups[-1].append(token)
    return groups


def route_flags(flags: list[str], stages: list[str]) -> dict[str, list[str]]:
    """Each stage's share of the pass-through flags: a stage knob (``--steps``, ``--envs``)
    goes only to the stages that have it, every other flag to all of them."""
    out: dict[str, list[str]] = {s: [] for s in stages}
    for group in _flag_groups(flags):
        name = group[0][2:].split("=", 1)[0]
        takers = [s for s in stages if name not in KNOBS or name in STAGES[s].knobs]
        if not takers:
            raise UsageError(f"-- --{name}: none of stages {', '.join(stages)} has this flag")
        for s in takers:
            out[s] += group
    return out


def check_stage_flags(stage: str, flags: list[str], games: list[str]) -> None:
    """UsageError unless the stage's own command line takes ``flags`` and they leave the flags
    the sweep sets alone. Stops short of what only a started run can find out."""
    parser = make_parser(stage, None)  # its knobs with their own types and bounds
    try:
        args = parser.parse_args(flags)
    except UsageError as e:
        raise UsageError(f"stage {stage}: {e}")
    for dest, instead in OWNED.items():
        if getattr(args, dest) != parser.get_default(dest):
            raise UsageError(f"-- --{dest.replace('_', '-')}: the sweep sets it for every run ({instead})")
    for game in games:
        size = args.replay_size or GAMES[game].replay_size
        initial = args.replay_initial or GAMES[game].replay_initial
        if initial > size:
            raise UsageError(f"--replay-initial {initial} is larger than the replay size {size} ({game})")


ARM_NAME = re.compile(r"[a-z0-9]{1,24}")


def parse_arms(texts: list[str] | None) -> list[tuple[str, list[str]]]:
    """``--arm NAME=FLAGS`` (repeated) -> [(name, [flags])]; none given: one arm without a name.
    ``NAME=`` is an arm of the stages as they are (the baseline the others are read against)."""
    if not texts:
        return [("", [])]
    arms = []
    for text in texts:
        name, eq, flags = text.partition("=")
        if not eq or not ARM_NAME.fullmatch(name.strip()):
            raise UsageError(f"--arm {text!r}: expected NAME=FLAGS, NAME of 1-24 lowercase letters and digits")
        try:
            arms.append((name.strip(), shlex.split(flags)))
        except ValueError as e:
            raise UsageError(f"--arm {text!r}: {e}")
    names = [name for name, _ in arms]
    if len(set(names)) != len(names):
        raise UsageError(f"--arm: each arm needs a name of its own ({', '.join(names)})")
    return arms


def plan(args) -> list[RunSpec]:
    """The grid, seed by seed, so that early results cover every stage and arm."""
    try:
        stages = parse_stages(args.stages)
    except ValueError as e:
        raise UsageError(f"--stages: {e}")
    seeds, games = parse_seeds(args.seeds), parse_games(args.games)
    arms = parse_arms(getattr(args, "arms", None))
    flags = {}  # (stage, arm) -> its flags: the sweep's pass-through flags, then the arm's own
    for arm, own in arms:
        routed, mine = route_flags(args.flags, stages), route_flags(own, stages) if own else {}
        for stage in stages:
            flags[stage, arm] = routed[stage] + mine.get(stage, [])
            if flags[stage, arm]:
                check_stage_flags(stage, flags[stage, arm], games)
    runs = [
        RunSpec(stage, game, seed, args.max_frames, args.save_every, args.progress, tuple(flags[stage, arm]),
                args.per_run_cpus, args.per_run_gpus, getattr(args, "save_replay", False), arm)
        for seed in seeds for game in games for stage in stages for arm, _ in arms
    ]  # fmt: skip
    if len(runs) > 10_000:
        raise UsageError(f"{len(runs)} runs is more than a sweep can hold")
    return runs


def seed_text(seeds: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    parts, start = [], None
    for i, s in enumerate(seeds):
        if start is None:
            start = s
        if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
            parts.append(str(start) if start == s else f"{start}-{s}")
            start = None
    return ",".join(parts)


@dataclasses.dataclass
class Job:
    """A run of the grid as the driver follows it, across its attempts."""

    spec: RunSpec
    status: str = "queued"  # one of STATUSES: queued, waiting (handed to the pool), running, done, skipped, ...
    attempts: int = 0  # in this invocation (a run that dies is retried once per invocation)
    earlier: int = 0  # attempts of earlier invocations, from their sweep.json
    frame: int = 0  # the run's latest agent step known here
    last_progress: int | None = None  # this attempt's latest PROGRESS frame
    token: int | None = None
    host: str | None = None
    node: str | None = None
    pid: int | None = None
    reason: str | None = None
    partial: str = ""  # an unfinished output line
    ringless: str | None = None  # why its last attempt went without its replay ring, where the sweep keeps rings


KEY = re.compile(r"(\d{2})(?:\+([a-z0-9]+))?-([a-z0-9_]+)-seed(\d+)")  # a run's folder name, RunSpec.key
ENDED = ("done", "skipped", "failed", "interrupted")  # the statuses a run keeps between invocations


def job_from_state(spec: RunSpec, state: dict) -> Job:
    """A run as an earlier invocation left it in sweep.json (``state``: its entry there)."""
    job = Job(spec, status=state.get("status") if state.get("status") in STATUSES else "queued")
    job.earlier, job.frame = state.get("attempts") or 0, state.get("frames") or 0
    job.host, job.node, job.reason, job.ringless = (state.get(k) for k in ("host", "node", "reason", "ringless"))
    return job


def carried_jobs(runs_dir: str, keys, states: dict) -> dict[str, Job]:
    """The runs of a sweep's folder that this invocation's grid leaves out (an earlier invocation
    ran other stages or seeds there): those sweep.json records and those with a folder under
    runs/, each as it was left; a run that no invocation is following now gets the status its
    summary gives. They are reported, never started."""
    try:
        folders = {n for n in os.listdir(runs_dir) if os.path.isdir(os.path.join(runs_dir, n))}
    except OSError:
        folders = set()
    carried = {}
    for key in (folders | set(states)) - set(keys):
        m = KEY.fullmatch(key)
        if not m or m.group(3) not in GAMES:
            continue
        spec = RunSpec(m.group(1), m.group(3), int(m.group(4)), None, 0, 0.0, (), 0.0, 0.0, arm=m.group(2) or "")
        job, summary = job_from_state(spec, states.get(key) or {}), read_summary(os.path.join(runs_dir, key))
        if summary:
            job.frame = summary.get("frames") or job.frame
        if not summary and not job.earlier and key not in folders:
            job.status = "queued"  # never launched (an earlier report may have called it interrupted)
        elif job.status not in ENDED:
            if not summary or summary.get("interrupted"):
                job.status = "interrupted"
            else:
                job.status = "failed" if summary.get("error") else "done"
        carried[key] = job
    return dict(sorted(carried.items(), key=lambda kv: (kv[1].spec.stage, kv[1].spec.game, kv[1].spec.seed)))


def read_summary(folder: str) -> dict | None:
    try:
        with open(os.path.join(folder, "summary.json")) as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def checkpoint_frame(folder: str) -> int | None:
    """The frame of the run's checkpoint, None where it has none that can be read."""
    path = os.path.join(folder, "checkpoint.pt")
    if not os.path.isfile(path):
        return None
    import torch  # here only: a Ray worker that launches runs never reads checkpoints

    try:
        frame = torch.load(path, map_location="cpu", weights_only=True, mmap=True).get("frame_idx")
    except Exception:
        return None
    return frame if isinstance(frame, int) else None


def run_complete(folder: str, max_frames: int | None) -> bool:
    """The run's summary says it ended on its own: solved, at --max-frames or past it, or ended by
    a layer of its net that no state makes active (``lib.run.probes.dead_units``: it could not learn again)."""
    s = read_summary(folder)
    if not s or s.get("interrupted") or s.get("error"):
        return False
    if s.get("solved") or dead_layer(s):
        return True
    return max_frames is not None and (s.get("frames") or 0) >= max_frames


def dead_layer(summary: dict) -> dict | None:
    """{"layer", "frame"} where a dead layer ended the run (``lib.run.probes.dead_units``), else None."""
    units = summary.get("units")
    if isinstance(units, dict) and units.get("ended_run") and isinstance(units.get("dead"), dict):
        return units["dead"]
    return None
