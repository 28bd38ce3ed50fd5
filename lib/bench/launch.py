"""One stage run: the stage script as a subprocess in its own process group, its PROGRESS and
RESULT lines read as they come, its summary.json read at the end.

A subprocess, not an in-process call: the bench's own process (its imports, threads and the
bound measurements' memory) must not share a run's timing, and Ctrl-C must end the stage's
whole group (its play process too) before the bench writes what it has.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from lib.run import procs
from lib.run.stages import ROOT, STAGES

PROGRESS_SEC = 5  # seconds between a stage's PROGRESS lines


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
    if "frames" in kv:
        out["frames"] = int(kv["frames"])
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


def new_record(spec: dict) -> dict:
    """The record of a planned run before it ran (or when it never did)."""
    return {
        "kind": spec["kind"],
        "round": spec["round"],
        "stage": spec["stage"],
        "label": spec["label"],
        "steps": spec["steps"],
        "fps": None,
        "train_frames": None,
        "frames": None,
        "seconds": None,
        "status": "not run",
        "error": None,
        "time": None,  # the run's time by part (summary.json's ``time``, ``lib.run.timing``)
        "weights_age": None,
    }


def stage_command(spec: dict, settings: dict, run_dir: str) -> list[str]:
    """The stage's command line; with --resume, first a copy of the checkpoint into ``run_dir``."""
    max_frames = settings.get("start_frame", 0) + settings["replay_initial"] + spec["frames"]
    if settings.get("resume"):
        # A stage writes its logs next to the checkpoint it resumes: each run gets its own copy.
        copy = os.path.join(run_dir, "resumed", "checkpoint.pt")
        os.makedirs(os.path.dirname(copy), exist_ok=True)
        shutil.copyfile(settings["resume"], copy)
        where = ["--resume", copy]  # a resume goes on with the checkpoint's seed
    else:
        where = ["--run-dir", run_dir, "--seed", str(settings["seed"])]
    return [
        sys.executable,
        STAGES[spec["stage"]].path,
        "--device",
        settings["device"],
        "--replay-initial",
        str(settings["replay_initial"]),
        "--max-frames",
        str(max_frames),
        *where,
        "--quiet",
        "--progress",
        str(PROGRESS_SEC),
        *spec["args"],
    ]


def run_stage(spec: dict, settings: dict, run_dir: str, log=print) -> dict:
    """Run one stage as a subprocess and return its record. KeyboardInterrupt or Terminated
    end the child's group first, then propagate with the record in ``exc.record``."""
    os.makedirs(run_dir, exist_ok=True)
    cmd = stage_command(spec, settings, run_dir)
    max_frames = int(cmd[cmd.index("--max-frames") + 1])
    record = dict(new_record(spec), status="failed")
    prefix = spec.get("prefix", spec["label"])
    log(f"{prefix}: start, {settings['replay_initial']} warm-up + {spec['frames']} training frames")
    started = time.perf_counter()
    result = None
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
            text=True,
            env=dict(os.environ, PYTHONUNBUFFERED="1"),
            start_new_session=True,  # its own process group: Ctrl-C reaches the bench, which ends the group
        )
        try:
            for line in proc.stdout:
                progress = parse_progress_line(line)
                if progress is not None:
                    log(progress_text(prefix, progress, max_frames))
                result = parse_result_line(line) or result
            procs.end_group(proc, terminate=False)
        except BaseException as exc:
            procs.end_group(proc, terminate=True)
            record.update(status="interrupted", error=type(exc).__name__)
            fill_record(record, result, find_summary(run_dir))
            exc.record = record
            raise
        finally:
            proc.stdout.close()
        err.seek(0)
        err_lines = [line.strip() for line in err.read().splitlines() if line.strip()]
    judge(record, proc.returncode, result, find_summary(run_dir), err_lines)
    if record["status"] == "ok":
        wall = time.perf_counter() - started
        log(f"{prefix}: {record['fps']:.1f} f/s over {record['train_frames']} training frames ({wall:.0f} s)")
    else:
        log(f"{prefix}: FAILED ({record['error']})")
    return record


def judge(record: dict, returncode: int, result: dict | None, summary: dict | None, err_lines: list[str]) -> None:
    """Fill the record from what the run left, and say whether it counts."""
    fill_record(record, result, summary)
    if returncode != 0:
        record["error"] = err_lines[-1] if err_lines else f"exit code {returncode}"
    elif result is None and summary is None:
        record["error"] = "no RESULT line"
    elif not record["train_frames"]:
        record["error"] = "no training frames (the run ended before the buffer filled)"
    else:
        record["status"] = "ok"


def fill_record(record: dict, result: dict | None, summary: dict | None) -> None:
    if result:
        record.update(fps=result.get("fps"), frames=result.get("frames"), seconds=result.get("seconds"))
    if summary:
        record.update(
            fps=summary.get("fps"),
            frames=summary.get("frames"),
            train_frames=summary.get("train_frames"),
            seconds=summary.get("seconds"),
            time=summary.get("time"),
            weights_age=summary.get("weights_age"),
        )
