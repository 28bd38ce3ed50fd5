"""The registry of stages: what each numbered script is, in one place.

The bench, the sweep, the tests and the stage table of docs/stages.md read this list; a new stage touches its
script and one entry here. A stage's bound on a machine follows from its fields: which wrapper
set its env steps cost (``wrappers``), which train step its learner runs (``learner``), how its
batches reach that step (``sampling``), and whether play shares the trainer's process
(``play``: ``inline``), runs beside it (``process``) or drives a native vector env beside it
(``vector``). The bench times those parts with the stage's own code, through the contract that
every script keeps (``lib.run.scripts.load_script``).

A stage lists the knobs it has (``lib.run.knobs``: the flags some stages have and others not);
its command line is ``lib.run.stage_args``'s, and its script is loaded by ``lib.run.scripts``.
"""

from __future__ import annotations

import dataclasses
import os

from lib.run import cli

ROOT = cli.ROOT  # the folder of the stage scripts

ARTICLE_HW = "GTX 1080Ti, 2017"
# The article's stage-02 table: f/s against play steps N (batch 32*N).
ARTICLE_SWEEP = {1: 154, 2: 200, 3: 212, 4: 227, 5: 228, 6: 232}
# The article's time to solve Pong (a mean of the last 100 games above 18), in minutes, for the
# two stages it gives one: the basic version in 60-90 minutes, the final one in 20-30, each
# "depending on the seed". In frames at the stage's article f/s: ``article_solve_frames``.
ARTICLE_SOLVE_MINUTES = {"01": (60, 90), "05": (20, 30)}

# What a run measures (``lib.run.probes``): every stage its time by part and its net's units; a play
# process beside the trainer (03-08) the age of the weights it acts with too.
ONE_PROCESS = ("time_by_part", "dead_units")
PLAY_PROCESS = ("time_by_part", "weights_age", "dead_units")


@dataclasses.dataclass(frozen=True)
class Stage:
    id: str  # "01": the script's number, also its run folders' prefix
    script: str  # file name in ROOT
    name: str  # short name in tables
    adds: str  # what it adds over the stage before it, one line
    article_fps: int | None  # the article's figure (GTX 1080Ti, 2017), None where not in it
    wrappers: str  # "old", "new" or "vector": the env it plays
    learner: str  # "fp32", "bf16" or "graph" (bf16, sampled on the device, captured): its train step
    # How a batch reaches the train step: "host" (``buffer.sample``), "pinned" (sampled into
    # pinned buffers by a ``PinnedStager``, copied without waiting), "device" (drawn on the device)
    sampling: str
    play: str  # "inline" (same process), "process" (a play process), "vector" (play process, vector env)
    knobs: tuple[str, ...] = ()  # the stage's own flags beyond the common ones: names of KNOBS
    gist: str = ""  # what it adds, in a few words: the README's stage table
    probes: tuple[str, ...] = ()  # the measurements its run takes (``lib.run.probes``), the first wrapping innermost

    @property
    def path(self) -> str:
        return os.path.join(ROOT, self.script)

    @property
    def module(self) -> str:
        """Import name of the script (the repository root on sys.path): ``03_parallel``."""
        return self.script[: -len(".py")]


STAGES: dict[str, Stage] = {
    s.id: s
    for s in (
        Stage(
            id="01",
            script="01_dqn_basic.py",
            name="basic",
            gist="the plain loop",
            adds="the plain loop: one env step, one train step on 32 transitions",
            article_fps=154,
            wrappers="old",
            learner="fp32",
            sampling="host",
            play="inline",
            knobs=(),
            probes=ONE_PROCESS,
        ),
        Stage(
            id="02",
            script="02_play_steps.py",
            name="play steps",
            gist="4 env steps a train step",
            adds="`--steps N` env steps per train step on a batch of 32*N (N=4)",
            article_fps=227,
            wrappers="old",
            learner="fp32",
            sampling="host",
            play="inline",
            knobs=("steps",),
            probes=ONE_PROCESS,
        ),
        Stage(
            id="03",
            script="03_parallel.py",
            name="parallel",
            gist="play in its own process",
            adds="playing in its own process; transitions over a bounded `torch.multiprocessing` Queue, the play process at most 2*N transitions ahead",
            article_fps=395,
            wrappers="old",
            learner="fp32",
            sampling="host",
            play="process",
            knobs=("steps", "lag"),
            probes=PLAY_PROCESS,
        ),
        Stage(
            id="04",
            script="04_cuda_async.py",
            name="cuda async",
            gist="copies without waiting",
            adds="batches sampled into reused pinned buffers, copied with `non_blocking=True`",
            article_fps=406,
            wrappers="old",
            learner="fp32",
            sampling="pinned",
            play="process",
            knobs=("steps", "lag"),
            probes=PLAY_PROCESS,
        ),
        Stage(
            id="05",
            script="05_new_wrapper.py",
            name="new wrappers",
            gist="OpenCV wrappers",
            adds="the newer OpenCV wrapper set (cv2 grey + 84x84 resize on uint8, two-frame max buffer)",
            article_fps=484,
            wrappers="new",
            learner="fp32",
            sampling="pinned",
            play="process",
            knobs=("steps", "lag"),
            probes=PLAY_PROCESS,
        ),
        Stage(
            id="06",
            script="06_bf16_learner.py",
            name="bf16 learner",
            gist="bf16, fused Adam",
            adds="bf16 autocast (fp32 master weights, fp32 Q head), channels_last, target under `inference_mode`, "
            "fused Adam",
            article_fps=None,
            wrappers="new",
            learner="bf16",
            sampling="pinned",
            play="process",
            knobs=("steps", "precision", "lag"),
            probes=PLAY_PROCESS,
        ),
        Stage(
            id="07",
            script="07_vector_play.py",
            name="vector play",
            gist="K games, batched acting",
            adds="`--envs K` games in ale-py's native vector env, batched action selection (eager)",
            article_fps=None,
            wrappers="vector",
            learner="bf16",
            sampling="pinned",
            play="vector",
            knobs=("steps", "envs", "precision", "lag"),
            probes=PLAY_PROCESS,
        ),
        Stage(
            id="08",
            script="08_graph_learner.py",
            name="graph learner",
            gist="train step as a CUDA graph",
            adds="the replay ring on the device; the whole train step captured as one CUDA graph (`--capture`), "
            "on CUDA the batched acting tried as one too",
            article_fps=None,
            wrappers="vector",
            learner="graph",
            sampling="device",
            play="vector",
            knobs=("steps", "envs", "capture", "precision", "lag"),
            probes=PLAY_PROCESS,
        ),
    )
}


def article_solve_frames(stage: str) -> tuple[int, int]:
    """The article's frames to solve Pong for ``stage`` (01: 554,400-831,600; 05: 580,800-871,200):
    its minutes times its f/s. KeyError for a stage the article gives no solve time for."""
    low, high = ARTICLE_SOLVE_MINUTES[stage]
    fps = STAGES[stage].article_fps
    return low * 60 * fps, high * 60 * fps


def parse_stages(text: str) -> list[str]:
    """'1,05, 7' -> ['01', '05', '07'] (sorted, no repeats); ValueError naming the bad part."""
    out = set()
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or f"{int(part):02d}" not in STAGES:
            raise ValueError(f"unknown stage {part!r} (known: {','.join(STAGES)})")
        out.add(f"{int(part):02d}")
    return sorted(out)


def markdown_table() -> str:
    """The table of stages in docs/stages.md, from the registry (``python -m lib.run.stages`` prints it)."""
    base = STAGES["01"].article_fps
    lines = [
        f"| script | adds over the previous one | article f/s ({ARTICLE_HW}) | vs 01 |",
        "|---|---|---|---|",
    ]
    for s in STAGES.values():
        fps, ratio = ("—", "—") if s.article_fps is None else (str(s.article_fps), f"{s.article_fps / base:.2f}")
        lines.append(f"| `{s.script}` | {s.adds} | {fps} | {ratio} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_table())
