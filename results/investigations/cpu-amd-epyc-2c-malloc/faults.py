"""Page faults per call of each part of a stage's trainer over one 3,400-frame run (1,000
warm-up): receiving from the play process, ring writes, sampling, loss (forward), backward,
Adam. The stage runs in this process, as ``python 07_vector_play.py`` would, with its parts
wrapped to count the process's minor page faults around each call.

    python results/investigations/cpu-amd-epyc-2c-malloc/faults.py 07|08    # the project's venv active
"""

import collections
import importlib
import os
import resource
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from lib import parallel  # noqa: E402
from lib.replay_device import DeviceReplayBuffer  # noqa: E402

faults, calls = collections.Counter(), collections.Counter()


def minor_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def count(owner, name: str, part: str) -> None:
    """Replace ``owner.name`` with a wrapper that adds its calls' faults to ``part``."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        before = minor_faults()
        try:
            return inner(*args, **kwargs)
        finally:
            faults[part] += minor_faults() - before
            calls[part] += 1

    setattr(owner, name, wrapper)


def main(stage: str) -> int:
    module = importlib.import_module({"07": "07_vector_play", "08": "08_graph_learner"}[stage])
    count(parallel, "receive", "receive")
    count(torch.Tensor, "backward", "backward")
    count(torch.optim.Adam, "step", "adam")
    if stage == "07":
        from lib.staging import PinnedStager

        count(module, "train_step", "train_step")
        count(PinnedStager, "sample", "sample")
        count(module, "calc_loss", "loss")
    else:
        import lib.graph_step as graph_step

        count(graph_step.TrainStep, "__call__", "train_step")
        count(graph_step, "calc_loss", "loss")
        count(DeviceReplayBuffer, "add_vector_step", "ring writes")
        count(DeviceReplayBuffer, "sample", "sample")
    argv = ["--device", "cpu", "--max-frames", "3400", "--replay-initial", "1000", "--quiet"]
    code = module.main(argv + ["--run-dir", f"/tmp/faults-runs{stage}"])
    per_call = ", ".join(f"{part} {faults[part] / max(1, calls[part]):.0f} x{calls[part]}" for part in calls)
    print(f"FAULTS stage={stage} process={minor_faults()} per call: {per_call}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
