"""A stage's command line: the flags every stage shares and the stage's own knobs."""

from __future__ import annotations

from lib.params import GAMES
from lib.run import cli
from lib.run.knobs import KNOBS
from lib.run.stages import STAGES


def make_parser(stage: str, description: str | None) -> cli.Parser:
    """The command-line contract every stage keeps, and the stage's own knobs (the registry's).
    A knob the stage does not have is no flag, and its value is the knob's ``unset``."""
    p = cli.Parser(description=(description or "").split("\n\n")[0], prog=STAGES[stage].script)
    cli.add_device(p)
    p.add_argument("--cuda", action="store_true", help="shorthand for --device cuda")
    p.add_argument("--game", default=None, help=f"hyperparameter set: {', '.join(GAMES)} (default pong)")
    p.add_argument("--env", default=None, help="gymnasium env id to use instead of the game's")
    p.add_argument("--seed", type=cli.seed, default=0, help="seeds python, numpy, torch and the env")
    p.add_argument("--max-frames", type=cli.positive, default=None, help="stop after N agent steps")
    p.add_argument("--replay-initial", type=cli.positive, default=None, help="transitions before training")
    p.add_argument("--replay-size", type=cli.positive, default=None, help="replay buffer capacity")
    p.add_argument("--run-dir", default="runs", help="TensorBoard root; one sub-folder per run")
    p.add_argument("--save-every", type=cli.positive, default=None, help="checkpoint every N agent steps")
    p.add_argument("--resume", default=None, metavar="PATH", help="continue from a checkpoint")
    p.add_argument(
        "--save-replay",
        action="store_true",
        help="checkpoints also hold the replay buffer and the game in progress, so --resume loses nothing",
    )
    p.add_argument("--quiet", action="store_true", help="no per-game lines")
    p.add_argument(
        "--progress", type=cli.positive_float, default=None, metavar="SEC", help="a PROGRESS line every SEC s"
    )
    for knob in KNOBS.values():
        if knob.name in STAGES[stage].knobs:
            p.add_argument(
                f"--{knob.name}", type=knob.parse, default=knob.default, choices=knob.choices, help=knob.help
            )
        else:
            p.set_defaults(**{knob.name: knob.unset})
    return p
