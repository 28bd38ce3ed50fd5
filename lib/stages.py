"""The registry of stages: what each numbered script is, in one place.

The bench, the sweep, the tests and the README table read this list; a new stage touches its
script and one entry here. A stage's bound on a machine follows from its fields: which wrapper
set its env steps cost (``wrappers``), which train step its learner runs (``learner``), and
whether play shares the trainer's process (``play``: ``inline``), runs beside it (``process``)
or drives a native vector env beside it (``vector``).
"""

from __future__ import annotations

import dataclasses
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the folder of the stage scripts

ARTICLE_HW = "GTX 1080Ti, 2017"
# The article's stage-02 table: f/s against play steps N (batch 32*N).
ARTICLE_SWEEP = {1: 154, 2: 200, 3: 212, 4: 227, 5: 228, 6: 232}


@dataclasses.dataclass(frozen=True)
class Stage:
    id: str  # "01": the script's number, also its run folders' prefix
    script: str  # file name in ROOT
    name: str  # short name in tables
    adds: str  # what it adds over the stage before it, one line
    article_fps: int | None  # the article's figure (GTX 1080Ti, 2017), None where not in it
    wrappers: str  # "old", "new" or "vector": the env it plays
    learner: str  # "fp32", "bf16" or "graph" (bf16, sampled on the device, captured): its train step
    play: str  # "inline" (same process), "process" (a play process), "vector" (play process, vector env)
    knobs: tuple[str, ...] = ()  # the stage's own flags beyond the common ones ("steps", "envs")

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
        Stage("01", "01_dqn_basic.py", "basic",
              "the plain loop: one env step, one train step on 32 transitions",
              154, "old", "fp32", "inline"),
        Stage("02", "02_play_steps.py", "play steps",
              "`--steps N` env steps per train step on a batch of 32*N (N=4)",
              227, "old", "fp32", "inline", ("steps",)),
        Stage("03", "03_parallel.py", "parallel",
              "playing in its own process; transitions over a bounded `torch.multiprocessing` Queue, lock-step",
              395, "old", "fp32", "process", ("steps",)),
        Stage("04", "04_cuda_async.py", "cuda async",
              "batches sampled into reused pinned buffers, copied with `non_blocking=True`",
              406, "old", "fp32", "process", ("steps",)),
        Stage("05", "05_new_wrapper.py", "new wrappers",
              "the newer OpenCV wrapper set (cv2 grey + 84x84 resize on uint8, two-frame max buffer)",
              484, "new", "fp32", "process", ("steps",)),
        Stage("06", "06_bf16_learner.py", "bf16 learner",
              "bf16 autocast (fp32 master weights, fp32 Q head), channels_last, target under `inference_mode`, "
              "fused Adam",
              None, "new", "bf16", "process", ("steps",)),
        Stage("07", "07_vector_play.py", "vector play",
              "`--envs K` games in ale-py's native vector env, batched action selection",
              None, "vector", "bf16", "vector", ("steps", "envs")),
        Stage("08", "08_graph_learner.py", "graph learner",
              "the replay ring on the device; the whole train step captured as one CUDA graph (`--capture`)",
              None, "vector", "graph", "vector", ("steps", "envs", "capture")),
    )
}  # fmt: skip


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
    """The README's table of stages, from the registry (``python -m lib.stages`` prints it)."""
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
