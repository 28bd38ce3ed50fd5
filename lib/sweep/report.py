"""What a sweep tells: the progress line while it runs, and at the end its folder's README.md
(command, commit, hardware, wall time, the runs, seed statistics, and the folder's NOTES.md
where it has one), sweep.json (the grid, each run's state, the invocations) and the seed
statistics of lib.analysis.seed_stats (curves.png, curves.md).
"""

from __future__ import annotations

import collections
import glob
import json
import os
import time

import torch

from lib.analysis import reference, run_folders, seed_stats
from lib.bench import machine
from lib.run.checkpoint import atomic_write
from lib.run.stages import STAGES
from lib.sweep.grid import ACTIVE, dead_layer, read_summary

LEVELS = list(reference.LEVELS)  # reward_100 levels of the seed statistics: frames to reach each
# A run "stalls" when the best reward_100 of its last STALL_FRAMES agent steps is less than
# STALL_RISE above its best before them: on Pong, a net that has not learned one more point in
# 300k frames (the 2017 run gained 17 over its last 300k) is unlikely to solve, and a sweep
# carried to a solve is better spent on another seed.
STALL_FRAMES = 300_000
STALL_RISE = 1.0


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{max(seconds, 0):.0f} s"
    minutes = round(seconds / 60)
    return f"{minutes // 60} h {minutes % 60:02d} min" if minutes >= 60 else f"{max(minutes, 0)} min"


def progress_line(sweep) -> str:
    """'sweep: 3/10 done, 2 running, 0 failed, 5 queued; ETA 2 h 05 min' (``sweep``: the driver's
    Sweep). The ETA is from the agent steps run during this invocation."""
    c = collections.Counter(j.status for j in sweep.jobs.values())
    head = (
        f"sweep: {c['done'] + c['skipped']}/{len(sweep.jobs)} done, {c['running']} running, {c['failed']} failed, "
        f"{c['queued'] + c['waiting']} queued" + (f", {c['interrupted']} interrupted" if c["interrupted"] else "")
    )
    left = None
    limits = [j.spec.max_frames for j in sweep.jobs.values()]
    if all(m is not None for m in limits):
        left = sum(max(0, j.spec.max_frames - j.frame) for j in sweep.jobs.values() if j.status in ACTIVE + ("queued",))
    elapsed = time.monotonic() - sweep.t0
    if left == 0 or left is None:
        eta = "—" if left is None else "0 min"
    elif sweep.frames_here > 0 and elapsed > 0:
        eta = _duration(left / (sweep.frames_here / elapsed))
    else:
        eta = "—"
    return f"{head}; ETA {eta}"


def hardware_lines(pool) -> list[str]:
    """Where the runs went: the cluster's nodes, or this machine's CPU, memory and GPUs."""
    if pool.kind == "ray":
        lines = [f"- where: {pool.describe()}"]
        for n in pool.nodes:
            res = n["Resources"]
            lines.append(
                f"  - node {n.get('NodeManagerHostname', '?')} ({n.get('NodeID', '?')[:12]}): "
                f"{res.get('CPU', 0):g} CPUs, {res.get('GPU', 0):g} GPUs, {res.get('memory', 0) / 2**30:.1f} GiB"
            )
        return lines
    gpus = ""
    if pool.gpu_names:
        gpus = ", GPUs: " + ", ".join(torch.cuda.get_device_name(i) for i in range(len(pool.gpu_names)))
    mem, isa = machine.memory_gib(), machine.cpu_isa(machine.cpu_flags())
    return [
        f"- where: {pool.describe()}",
        f"- hardware: {machine.cpu_model()}"
        + (f" ({isa})" if isa else "")
        + f", {pool.total_cpus} cores"
        + (f", {mem} GiB" if mem else "")
        + gpus,
    ]


def _minutes(summary: dict) -> str:
    """A run's minutes for the table: over all its sittings; a resumed run whose checkpoint did
    not keep its time shows its last sitting's, from the frame it resumed at."""
    if summary.get("run_seconds") is not None:
        return f"{summary['run_seconds'] / 60:.1f}"
    if summary.get("seconds") is None:
        return "—"
    if summary.get("start_frame"):
        return f"{summary['seconds'] / 60:.1f} from frame {summary['start_frame']}"
    return f"{summary['seconds'] / 60:.1f}"


def _phase_speeds(folder: str, summary: dict) -> tuple[float | None, float | None]:
    """A run's f/s of training while epsilon decays and once it is at its floor (where a solve
    spends its time), over all its sittings, from its event files (``lib.analysis.run_folders.phase_fps``);
    None where the run has no game there yet, or no summary.json to give its schedule."""
    params = summary.get("params") or {}
    initial, decay = params.get("replay_initial"), params.get("epsilon_frames")
    if not glob.glob(os.path.join(folder, "events.*")) or initial is None or decay is None:
        return None, None
    floor = max(decay, initial)
    try:
        early, late = run_folders.phase_fps(folder, [(initial, floor), (floor, None)], warmup=initial)
        return early, late
    except (OSError, ValueError):  # an event file gone or unreadable: the seed statistics name it
        return None, None


def _resumes(folder: str, summary: dict, frame: int | None) -> tuple[int, int, int | None]:
    """A run's resumes, those of them with its replay ring, and the frames it played untrained
    after them (``lib.analysis.run_folders.untrained_frames``; None where that is not known)."""
    resumed = run_folders.resumes(folder) if glob.glob(os.path.join(folder, "events.*")) else []
    initial = (summary.get("params") or {}).get("replay_initial")
    last = summary.get("frames") or frame or 0
    untrained = run_folders.untrained_frames(resumed, initial, last) if initial is not None or not resumed else None
    return len(resumed), sum(bool(r) for _, r in resumed), untrained


def every_run(sweep) -> dict:
    """This invocation's runs and the folder's others (``Sweep.carried``), by stage, game and seed."""
    runs_ = {**sweep.carried, **sweep.jobs}
    return dict(
        sorted(runs_.items(), key=lambda kv: (kv[1].spec.stage, kv[1].spec.arm, kv[1].spec.game, kv[1].spec.seed))
    )


def _runs_table(sweep) -> tuple[list[str], dict]:
    """The README's row of each run of the folder, and each run's state for sweep.json."""
    rows, states = [], {}
    for key, job in every_run(sweep).items():
        s = read_summary(sweep.folder(job)) or {}
        resumed, ringed, untrained = _resumes(sweep.folder(job), s, job.frame)
        states[key] = {
            "status": job.status, "attempts": job.earlier + job.attempts, "frames": s.get("frames", job.frame or None),
            "host": job.host, "node": job.node, "reason": job.reason, "resumes": resumed,
            "resumes_with_ring": ringed, "untrained_frames": untrained, "ringless": job.ringless,
        }  # fmt: skip
        minutes = _minutes(s)
        early, late = _phase_speeds(sweep.folder(job), s)
        states[key]["fps_decaying"], states[key]["fps_floor"] = early, late
        early, late = (f"{v:.1f}" if v is not None else "—" for v in (early, late))
        mean = f"{s['mean_reward']:.1f}" if s.get("mean_reward") is not None else "—"
        solved = {True: "yes", False: "no"}.get(s.get("solved"), "—")
        dead = dead_layer(s)
        if dead:
            solved = f"no: {dead['layer']} dead from frame {dead['frame']}"
        status = ("past --max-frames" if job.reason else "done before") if job.status == "skipped" else job.status
        resumes = f"{resumed} ({ringed} with ring)" if ringed else str(resumed)
        rows.append(
            f"| {key} | {status} | {s.get('frames', '—')} | {minutes} | {early} | {late} | {mean} | {solved} | "
            f"{resumes} | {'—' if untrained is None else untrained} | {job.earlier + job.attempts} | {job.host or '—'} |"
        )
    return rows, states


def _levels_table(sweep) -> list[str]:
    """Per run with points: its knobs (precision, N, K) and frames to each of ``LEVELS`` and
    reward_100 at each of ``reference.AT_FRAMES``, and the 2017 run's below, for Pong."""
    head = ["run", "precision, N, K"] + [f"frames to {level:g}" for level in LEVELS]
    head += [f"at {f // 1000}k" for f in reference.AT_FRAMES]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    pong_marks = []  # each Pong run's (frames to each level or None, played, reward_100 at each of AT_FRAMES)
    curves = []  # each unsolved run's (name, frames, reward_100), for stall_line
    for key, job in every_run(sweep).items():
        folder = sweep.folder(job)
        frames, minutes, values = (
            run_folders.load_curve(folder) if glob.glob(os.path.join(folder, "events.*")) else ([],) * 3
        )
        if not frames:
            continue
        stage = STAGES[job.spec.stage]
        stretches = run_folders.settings(
            folder, 4 if "steps" in stage.knobs else 1, "fp32" if stage.learner == "fp32" else run_folders.NEVER
        )
        what = run_folders.settings_text(stretches)
        played = run_folders.played_frames(folder)
        reached, at = reference.marks(frames, minutes, values, LEVELS, played)
        if job.spec.game == reference.GAME:
            pong_marks.append(([None if r is None else r[0] for r in reached], played or frames[-1], at))
        if not (read_summary(folder) or {}).get("solved"):
            curves.append((key, frames, values))
        cells = [key, what] + [run_folders.NEVER if r is None else str(r[0]) for r in reached]
        lines.append("| " + " | ".join(cells + [run_folders.NEVER if v is None else f"{v:.1f}" for v in at]) + " |")
    if len(lines) == 2:
        return []
    if pong_marks:
        frames, minutes, values = reference.curve()
        reached, at = reference.marks(frames, minutes, values, LEVELS)
        cells = [reference.LABEL, "fp32, 1, 1"] + [run_folders.NEVER if r is None else str(r[0]) for r in reached]
        lines.append("| " + " | ".join(cells + [f"{v:.1f}" for v in at]) + " |")
        places = _reference_places(reached, at, pong_marks)
        lines += ["", places] if places else []
    stalls = stall_line(curves)
    lines += ["", stalls] if stalls else []
    return ["Each run: frames to each level of reward_100 and reward_100 at fixed frames", "", *lines, ""]


def stall_line(curves) -> str:
    """One line on the unsolved runs long enough to judge (``curves``: (name, frames, reward_100)
    of each): those whose best reward_100 over their last STALL_FRAMES agent steps is less than
    STALL_RISE above their best before them, named with both bests, or that none has; empty where
    no run has played STALL_FRAMES past its first point."""
    judged, stalled = 0, []
    for name, frames, values in curves:
        if not frames or frames[-1] - frames[0] < STALL_FRAMES:
            continue
        judged += 1
        cut = frames[-1] - STALL_FRAMES
        before = max(v for f, v in zip(frames, values) if f <= cut)
        since = max(v for f, v in zip(frames, values) if f > cut)
        if since - before < STALL_RISE:
            stalled.append(f"{name} (best {before:.1f} by frame {cut}, {since:.1f} since)")
    if not judged:
        return ""
    rule = (f"best reward_100 of the last {STALL_FRAMES // 1000}k frames less than {STALL_RISE:g} above the best "
            "before them")  # fmt: skip
    if not stalled:
        return f"Stalled ({rule}): none ({judged} unsolved runs long enough to tell)."
    return f"Stalled ({rule}): {'; '.join(stalled)}."


def _reference_places(reached, at, pong_marks) -> str:
    """One line: where the 2017 run stands among the sweep's Pong runs at each level and each of
    ``reference.AT_FRAMES`` (``reference.place``); empty where no run can be placed."""
    cells = []
    for i, level in enumerate(LEVELS):
        ours = None if reached[i] is None else reached[i][0]
        theirs = [reference.frames_or_later(r[i], played, ours) for r, played, _ in pong_marks]
        where = reference.place(ours, theirs, higher_is_better=False)
        if where:
            cells.append(f"frames to {level:g}: {where[0]} of {where[1]}")
    for i, frame in enumerate(reference.AT_FRAMES):
        where = reference.place(at[i], [a[i] for _, _, a in pong_marks], higher_is_better=True)
        if where:
            cells.append(f"reward_100 at {frame // 1000}k: {where[0]} of {where[1]}")
    if not cells:
        return ""
    return (
        "Where the 2017 run stands among these Pong runs (1: ahead of every one; a run that stopped short "
        "of its figure without reaching it is left out): " + "; ".join(cells) + ". Were it one more seed "
        "of them, it would stand at that place or better by chance k / n, for k of n."
    )


def runs_of(state: dict) -> dict:
    """Each run's state in a parsed sweep.json (empty where it has none)."""
    runs_ = state.get("runs")
    return {k: v for k, v in runs_.items() if isinstance(v, dict)} if isinstance(runs_, dict) else {}


def invocations_of(state: dict) -> list[dict]:
    """The invocations a parsed sweep.json lists, oldest first (empty where it has none)."""
    invocations = state.get("invocations")
    return [i for i in invocations if isinstance(i, dict)] if isinstance(invocations, list) else []


def _read_state(out: str) -> dict:
    """The folder's sweep.json, {} where there is none or it cannot be read."""
    try:
        with open(os.path.join(out, "sweep.json")) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def previous_runs(out: str) -> dict:
    """Each run's state as the last invocation left it in sweep.json (empty where there is none)."""
    return runs_of(_read_state(out))


def recorded_invocations(out: str) -> list[dict]:
    """The invocations sweep.json lists, oldest first (empty where there is none)."""
    return invocations_of(_read_state(out))


def _save_state(out: str, meta: dict, states: dict) -> list[dict]:
    """sweep.json: the grid, each run's state, and this invocation after the earlier ones (returned)."""
    state_path = os.path.join(out, "sweep.json")
    invocations = recorded_invocations(out)
    invocations.append({k: meta[k] for k in ("command", "commit", "date", "wall_s", "where", "outcome", "hardware")})
    state = json.dumps({"grid": meta["grid"], "runs": states, "invocations": invocations}, indent=2)
    atomic_write(state_path, lambda f: f.write(state.encode()))
    return invocations


def _seeds_section(out: str, sweep) -> str:
    """The seed statistics of the runs that logged anything (curves.md, curves.png), as Markdown."""
    seeds_md = ""
    have = [sweep.folder(j) for j in every_run(sweep).values() if glob.glob(os.path.join(sweep.folder(j), "events.*"))]
    if have:
        stats = seed_stats.seed_stats(have, LEVELS)
        seeds_md = seed_stats.seed_markdown(stats, LEVELS)
        if any(g["frames"] is not None for g in stats["groups"].values()):
            seed_stats.plot_seeds(stats, LEVELS, os.path.join(out, "curves.png"))
            seeds_md = "![reward_100 per stage](curves.png)\n\n" + seeds_md
        with open(os.path.join(out, "curves.md"), "w") as f:
            f.write(seeds_md + "\n")
    return seeds_md


NOTES = "NOTES.md"  # the folder's own words (what ran beside the sweep, say): kept in its README


def notes_section(out: str) -> list[str]:
    """The lines of the folder's NOTES.md, if it has one, under the README's last heading: the
    README is written anew by every invocation, and what a person adds there goes in NOTES.md."""
    try:
        with open(os.path.join(out, NOTES), encoding="utf-8") as f:
            text = f.read().strip()
    except (OSError, UnicodeDecodeError):
        return []
    return ["## Notes", "", text, ""] if text else []


def write_report(out: str, sweep, meta: dict, record: bool = True) -> None:
    """README.md, sweep.json and the seed statistics (curves.png, curves.md) of the folder.
    ``sweep``: the driver's Sweep, its runs as they ended; ``meta``: this invocation's facts
    (command, commit, date, wall_s, where, outcome, grid, hardware: the README's lines).
    ``record=False`` (``--report``): ``meta`` is the last invocation's, and sweep.json is left
    as it is."""
    rows, states = _runs_table(sweep)
    invocations = _save_state(out, meta, states) if record else recorded_invocations(out)
    seeds_md = _seeds_section(out, sweep)
    total_wall = sum(inv.get("wall_s") or 0 for inv in invocations)
    failed = [(k, j) for k, j in every_run(sweep).items() if j.status == "failed"]
    also = [f"- also in this folder, outside this grid: {len(sweep.carried)} runs of earlier sweeps, as they "
            f"were left ({', '.join(sweep.carried)})"] if sweep.carried else []  # fmt: skip
    lines = [
        f"# Sweep: stages {meta['grid']['stages']} x seeds {meta['grid']['seeds']} x {meta['grid']['games']}"
        + (
            f" x arms {', '.join(a.split('=')[0] or '(as they are)' for a in meta['grid']['arms'])}"
            if meta["grid"].get("arms")
            else ""
        ),
        "",
        *[
            f"- arm `{a.split('=', 1)[0]}`: `{a.split('=', 1)[1] or '(no flags: the stages as they are)'}`"
            for a in meta["grid"].get("arms") or []
        ],
        f"- command: `{meta['command']}`",
        f"- commit: {meta['commit']}; date: {meta['date']}",
        *meta["hardware"],
        (
            f"- wall time: {_duration(meta['wall_s'])} this time ({meta['outcome']}), "
            f"{_duration(total_wall)} over the {len(invocations)} time(s) the sweep ran here"
        ),
        f"- {progress_line(sweep).removeprefix('sweep: ').split('; ETA')[0]}",
        *also,
        "",
        "## Runs",
        "",
        "| run | status | frames | minutes | f/s, ε decaying | f/s, ε at floor | mean reward | solved | resumes "
        "| untrained frames | attempts | host |",
        "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
        *rows,
        "",
        "minutes: the run's time to reach its frames over all its processes, each resume starting one (the"
        " frames a process played past its last checkpoint are played again and counted once); f/s: agent steps"
        " per second of training over all its processes, from the speed each game logged, while epsilon decays"
        " (from the replay buffer's first fill to epsilon_frames) and once epsilon is at its floor; a resumed"
        " process's games before its buffer is full again are left out. resumes: the processes that went on"
        " from a checkpoint (with"
        " ring: its replay ring came back); untrained frames: those played after a resume without its ring"
        " while the buffer refilled (replay_initial, fewer where the run stopped first), — where a resume"
        " does not say whether its ring came back.",
    ]
    if failed:
        lines += ["", "Failed runs (their logs are in `runs/<run>/run.log`):", ""]
        for key, job in failed:
            lines.append(f"- {key}: {job.reason}")
            lines += [f"    {line}" for line in sweep.tail(job, 5)]
    ringless = [f"- {key}: {job.ringless}" for key, job in every_run(sweep).items() if job.ringless]
    if ringless:
        lines += ["", "Went without their replay ring (each resume refills the buffer untrained):", "", *ringless]
    past = [f"- {key}: {job.reason}" for key, job in sweep.jobs.items() if job.status == "skipped" and job.reason]
    if past:
        lines += ["", "Not run (a larger `--max-frames` lets them go on):", "", *past]
    lines += ["", "## Seeds", "", seeds_md or "No run has logged reward_100 yet (no game has ended).", ""]
    lines += _levels_table(sweep)
    lines += notes_section(out)
    with open(os.path.join(out, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
