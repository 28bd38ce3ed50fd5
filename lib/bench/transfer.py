"""What one transition costs through the stage-03 Queue (``python -m lib.bench.transfer``): the
reason stages 03-06 send one frame per item and never the four-frame stack."""

from __future__ import annotations

import time

import numpy as np

from lib.parallel import Transition, context


def _send_items(queue, item, count):
    for _ in range(count):
        queue.put(item)
    queue.put(None)


def measure_transfer(count: int = 3000) -> dict:
    """What one transition costs through the stage-03 Queue: pickled bytes, and microseconds
    per item at full throughput (a play-process sender, this process receiving), for the one-frame
    item the stages send and for the four-frame stack they avoid sending."""
    from multiprocessing.reduction import ForkingPickler

    frame = np.random.default_rng(0).integers(0, 256, (84, 84), dtype=np.uint8)
    items = {
        "one frame": Transition(None, 3, 1.0, False, frame, False, None),
        "four frames": Transition(None, 3, 1.0, False, np.stack([frame] * 4), False, None),
    }
    out = {}
    ctx = context()
    for name, item in items.items():
        queue = ctx.Queue(maxsize=8)
        proc = ctx.Process(target=_send_items, args=(queue, item, count), daemon=True)
        proc.start()
        queue.get()  # the sender is up
        t0 = time.perf_counter()
        received = 1
        while queue.get() is not None:
            received += 1
        elapsed = time.perf_counter() - t0
        proc.join()
        out[name] = {
            "bytes": len(ForkingPickler.dumps(item)),
            "us_per_item": elapsed / (received - 1) * 1e6,
        }
    return out


if __name__ == "__main__":
    for name, cost in measure_transfer().items():
        print(f"{name}: {cost['bytes']} bytes pickled, {cost['us_per_item']:.1f} us per transition through the Queue")
