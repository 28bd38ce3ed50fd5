"""One table of bad input, tried against every stage in-process: each case must end in exit
code 2 with one line on stderr, no traceback, nothing printed on stdout, and nothing created
(no run folder; a checkpoint's folder as it was).

The checkpoints and replay rings come from real tiny runs of one stage of each ring family
(01: the old wrapper set, one ring, the game in progress; 05: the new set; 07: ale-py's
vector env, one ring per game; 08: the same rings on the device), made once per test worker.
A case applies to the stages for which its input is bad: a ring of stage 07 is bad input for
01-06 and fine for 07 and 08 (converted for 08, as the second test checks).
"""

import dataclasses
import io
import json
import os
import pathlib
import shutil

import pytest
import torch

from lib.run import cli
from lib.run.stages import STAGES
from tests.conftest import run_folder, run_inprocess

ALL = tuple(STAGES)
OLD, NEW, VECTOR = ("01", "02", "03", "04"), ("05", "06"), ("07", "08")
NO_CUDA = () if torch.cuda.is_available() else ALL  # --cuda is bad input only where there is none
ON_CPU = () if torch.cuda.is_available() else ("08",)
# Each stage resumes rings of its own family from this stage's run.
OWN = {**dict.fromkeys(OLD, "01"), **dict.fromkeys(NEW, "05"), "07": "07", "08": "08"}
SAVED = ("01", "05", "07", "08")
TINY = (
    "--max-frames",
    16,
    "--replay-size",
    128,
    "--replay-initial",
    16,
    "--save-every",
    16,
    "--save-replay",
    "--quiet",
)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A run folder with checkpoint.pt and its replay-16.pt from each stage of SAVED."""
    root = tmp_path_factory.mktemp("saved")
    folders = {}
    for stage in SAVED:
        res = run_inprocess(stage, "--run-dir", root / stage, *TINY)
        assert res.code == 0, res.stderr
        folders[stage] = run_folder(root / stage)
    return folders


def _rewrite(path, data) -> None:
    """Write ``path`` anew (bytes, or an object torch saves): a new file, never the one it was a
    link to, so that a case's copy can be spoiled without touching the saved run."""
    if not isinstance(data, bytes):
        buf = io.BytesIO()
        torch.save(data, buf)
        data = buf.getvalue()
    path.unlink()
    path.write_bytes(data)


@dataclasses.dataclass
class Inputs:
    """Makes a case's files in ``tmp`` from the saved runs: each case gets its own folder of
    links to the saved files, and a file it spoils is written anew (``_rewrite``)."""

    saved: dict
    tmp: pathlib.Path

    def run(self, source: str) -> pathlib.Path:
        """A copy of the run folder of stage ``source``."""
        dest = self.tmp / f"from{source}"
        if not dest.exists():
            shutil.copytree(self.saved[source], dest, copy_function=os.link)
        return dest

    def ckpt(self, source: str, edit=None) -> pathlib.Path:
        """Its checkpoint, after ``edit(state)`` where given."""
        path = self.run(source) / "checkpoint.pt"
        if edit is not None:
            state = torch.load(path, weights_only=True)
            edit(state)
            _rewrite(path, state)
        return path

    def ring(self, source: str) -> pathlib.Path:
        return self.run(source) / "replay-16.pt"

    def file(self, name: str, data: bytes) -> pathlib.Path:
        path = self.tmp / name
        path.write_bytes(data)
        return path


def _link_loop(inputs):
    path = inputs.tmp / "loop.pt"
    path.symlink_to(path.name)
    return path


def _fifo(inputs):
    path = inputs.tmp / "fifo.pt"
    os.mkfifo(path)
    return path


def _cut(path, keep=0.5):
    data = path.read_bytes()
    _rewrite(path, data[: int(len(data) * keep)])
    return path


def _without(*names):
    def edit(state):
        for name in names:
            del state[name]

    return edit


def _other_net(state):
    state["net"]["conv.0.weight"] = torch.zeros(32, 3, 8, 8)  # three input frames, not four


def _saved(inputs, obj):
    path = inputs.tmp / "other.pt"
    torch.save(obj, path)
    return path


def own(stage, inputs):
    """The checkpoint of the saved run whose ring ``stage`` takes."""
    return inputs.ckpt(OWN[stage])


def _edit_saved(path, edit):
    """``edit(state)`` of a saved file's state, written anew."""
    state = torch.load(path, weights_only=True)
    edit(state)
    _rewrite(path, state)


def ring_edited(edit):
    """Arguments resuming the stage's own checkpoint after ``edit(state)`` of its ring's state."""

    def argv(inputs, stage):
        _edit_saved(inputs.ring(OWN[stage]), edit)
        return ["--resume", own(stage, inputs)]

    return argv


def ring_damaged(damage):
    """Arguments resuming the stage's own checkpoint after ``damage(path)`` of its ring's file."""

    def argv(inputs, stage):
        ckpt = own(stage, inputs)
        damage(inputs.ring(OWN[stage]))
        return ["--resume", ckpt]

    return argv


def _of_seed(path, seed):
    """The checkpoint at ``path`` rewritten as one of ``seed``; its path."""
    _edit_saved(path, lambda state: state.__setitem__("seed", seed))
    return path


def _old_checkpoint(state):
    del state["belongs"]
    state["replay"] = {k: state["replay"][k] for k in ("file", "capacity", "streams")}


def to_old_format(folder):
    """The checkpoint and ring of a run ``folder`` as the code before their ``belongs`` entries
    wrote them; returns the checkpoint's path."""
    _edit_saved(folder / "replay-16.pt", _without("belongs"))
    _edit_saved(folder / "checkpoint.pt", _old_checkpoint)
    return folder / "checkpoint.pt"


def old_format(source):
    """Arguments resuming the checkpoint and ring of ``source`` in the older format."""
    return lambda inputs, stage: ["--resume", to_old_format(inputs.run(source))]


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    argv: object  # (Inputs, stage) -> the stage's arguments
    words: str  # in the one line
    stages: tuple = ALL


CASES = [
    # Flags and numbers.
    Case("unknown game", lambda i, s: ["--game", "tetris"], "unknown game 'tetris'"),
    Case("unknown env id", lambda i, s: ["--env", "NoSuchGameNoFrameskip-v4"], "does not exist"),
    Case("env module missing", lambda i, s: ["--env", "no_such_module:Game-v0"], "does not exist"),
    Case("env not atari (CartPole)", lambda i, s: ["--env", "CartPole-v1"], "is not an Atari game"),
    Case("env not atari (FrozenLake)", lambda i, s: ["--env", "FrozenLake-v1"], "is not an Atari game"),
    Case(
        "env no rom", lambda i, s: ["--env", "tests.support.sidetarget:SideTarget-v0"], "is not an Atari game", VECTOR
    ),  # fmt: skip
    Case("frames zero", lambda i, s: ["--max-frames", "0"], "--max-frames: expected a number >= 1, got 0"),
    Case("frames negative", lambda i, s: ["--max-frames", "-5"], "expected a number >= 1, got -5"),
    Case("frames text", lambda i, s: ["--max-frames", "abc"], "expected a whole number"),
    Case("ring size zero", lambda i, s: ["--replay-size", "0"], "--replay-size: expected a number >= 1"),
    Case("fill above ring", lambda i, s: ["--replay-initial", "2000", "--replay-size", "1000"], "larger than"),
    Case("ring beyond memory", lambda i, s: ["--replay-size", "10000000000"], "GiB available"),
    Case("seed negative", lambda i, s: ["--seed", "-1"], "--seed: expected a number >= 0"),
    Case("seed beyond numpy", lambda i, s: ["--seed", "4294967296"], "--seed: expected a number from 0 to 4294967295"),
    Case("seed of 20 digits", lambda i, s: ["--seed", "9" * 20], "--seed: expected a number from 0 to 4294967295"),
    Case("seed beyond int32", lambda i, s: ["--seed", "2147483647", "--envs", "2"], "ale-py's vector env", VECTOR),
    Case("save every zero", lambda i, s: ["--save-every", "0"], "--save-every: expected a number >= 1"),
    Case("progress zero", lambda i, s: ["--progress", "0"], "--progress"),
    Case("progress nan", lambda i, s: ["--progress", "nan"], "--progress"),
    Case("device tpu", lambda i, s: ["--device", "tpu"], "--device"),
    Case("cuda without cuda", lambda i, s: ["--cuda"], "CUDA", NO_CUDA),
    Case("unknown flag", lambda i, s: ["--bogus"], "unrecognized arguments: --bogus"),
    Case("abbreviated flag", lambda i, s: ["--max-fr", "100"], "unrecognized arguments: --max-fr 100"),
    Case(
        "abbreviated knob", lambda i, s: ["--prec", "fp32"], "unrecognized arguments: --prec fp32", ("06", "07", "08")
    ),
    Case("ring without checkpoints", lambda i, s: ["--save-replay"], "--save-replay needs --save-every"),
    Case("steps zero", lambda i, s: ["--steps", "0"], "--steps"),
    Case("envs zero", lambda i, s: ["--envs", "0"], "--envs"),
    Case(
        "steps beyond ring",
        lambda i, s: ["--steps", "100", "--replay-size", "1000", "--replay-initial", "100"],
        "--steps",
    ),
    Case("capture graph on cpu", lambda i, s: ["--capture", "graph"], "--capture", ALL[:-1] + ON_CPU),
    Case("run dir under a file", lambda i, s: ["--run-dir", i.file("blocker", b"x") / "runs"], "not a writable"),
    Case("run dir name too long", lambda i, s: ["--run-dir", i.tmp / ("x" * 300)], "longer than 255 bytes"),
    # Checkpoints.
    Case("checkpoint missing", lambda i, s: ["--resume", i.tmp / "no" / "checkpoint.pt"], "no such file"),
    Case("checkpoint a folder", lambda i, s: ["--resume", i.tmp], "a folder, not a file"),
    Case("checkpoint a link loop", lambda i, s: ["--resume", _link_loop(i)], "a loop of symbolic links"),
    Case("checkpoint a named pipe", lambda i, s: ["--resume", _fifo(i)], "a named pipe (FIFO), not a file"),
    Case("checkpoint random bytes", lambda i, s: ["--resume", i.file("c.pt", os.urandom(3000))], "not a readable"),
    Case("checkpoint cut short", lambda i, s: ["--resume", _cut(i.ckpt("01"))], "not a readable checkpoint"),
    Case("checkpoint of nothing", lambda i, s: ["--resume", _saved(i, {"net": {}})], "not a dqn-speedup checkpoint"),
    Case("model file", lambda i, s: ["--resume", _saved(i, {"kind": "dqn-speedup-model"})], "not a dqn-speedup"),
    Case(
        "checkpoint lacks fields",
        lambda i, s: ["--resume", i.ckpt("01", _without("rng", "tracker"))],
        "lacks rng, tracker",
    ),  # fmt: skip
    Case(
        "checkpoint other params",
        lambda i, s: ["--resume", i.ckpt("01", lambda c: c["params"].update(n_step=3))],
        "hyperparameters",
    ),  # fmt: skip
    Case("checkpoint other net", lambda i, s: ["--resume", i.ckpt("01", _other_net)], "is not the Nature DQN"),
    Case(
        "checkpoint unknown game",
        lambda i, s: ["--resume", i.ckpt("01", lambda c: c.update(game="nosuch"))],
        "unknown game 'nosuch'",
    ),  # fmt: skip
    Case("resume other game", lambda i, s: ["--resume", own(s, i), "--game", "breakout"], "is for game 'pong'"),
    Case(
        "resume other env",
        lambda i, s: ["--resume", own(s, i), "--env", "BreakoutNoFrameskip-v4"],
        "was trained on PongNoFrameskip-v4",
    ),  # fmt: skip
    Case("resume not past", lambda i, s: ["--resume", own(s, i), "--max-frames", "16"], "is not past"),
    Case(
        "resume frame beyond int32",
        lambda i, s: ["--resume", _of_seed(own(s, i), 2**31 - 16)],  # a resume goes on with its checkpoint's seed
        "(its games and the resume frame)",
        VECTOR,
    ),  # fmt: skip
    # Replay rings.
    Case("ring missing", ring_damaged(os.remove), "is missing"),
    Case("ring cut short", ring_damaged(_cut), "cut short or corrupt"),
    Case("ring random bytes", ring_damaged(lambda p: _rewrite(p, os.urandom(5000))), "cut short or corrupt"),
    Case("ring of nothing", ring_damaged(lambda p: _rewrite(p, {"x": 1})), "is not a replay ring (no uint8"),
    Case("ring of another frame", ring_edited(lambda r: r["belongs"].update(frame_idx=8)), "saved at frame 8"),
    Case("ring of another game", ring_edited(lambda r: r["belongs"].update(game="breakout")), "game 'breakout'"),
    Case("ring of another size", lambda i, s: ["--resume", own(s, i), "--replay-size", "256"], "holds 128"),
    Case(
        "ring of other envs", lambda i, s: ["--resume", own(s, i), "--envs", "2"], "--envs 2: the checkpoint's", VECTOR
    ),  # fmt: skip
    Case("ring of the old set", lambda i, s: ["--resume", i.ckpt("01")], "cannot mix", NEW + VECTOR),
    Case("ring of the new set", lambda i, s: ["--resume", i.ckpt("05")], "cannot mix", OLD + VECTOR),
    Case("ring of stage 07", lambda i, s: ["--resume", i.ckpt("07")], "cannot mix", OLD + NEW),
    Case("ring of stage 08", lambda i, s: ["--resume", i.ckpt("08")], "cannot mix", OLD + NEW),
    Case("old-format ring of 07", old_format("07"), "cannot mix", OLD + NEW),
]


def _listing(root):
    return {p: (p.lstat().st_size, p.lstat().st_mtime_ns) for p in pathlib.Path(root).rglob("*")}


@pytest.mark.xdist_group("saved-runs")  # one worker makes the saved runs, once
@pytest.mark.parametrize(
    "case, stage",
    [pytest.param(c, s, id=f"{c.name}-{s}") for c in CASES for s in c.stages],
)
def test_every_stage_refuses_bad_input(case, stage, saved, tmp_path):
    inputs = Inputs(saved, tmp_path / "in")
    inputs.tmp.mkdir()
    argv = [str(a) for a in case.argv(inputs, stage)]
    runs = tmp_path / "runs"
    before = _listing(inputs.tmp)
    res = run_inprocess(stage, "--run-dir", runs, *argv)
    assert res.code == 2, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith(f"{STAGES[stage].script}: error: ") and case.words in lines[0], lines[0]
    assert res.stdout == ""
    assert not runs.exists(), "bad input created the run folder"
    assert _listing(inputs.tmp) == before, "bad input changed the checkpoint's folder"


def test_the_table_covers_enough():
    assert len(CASES) >= 30 and len({s for c in CASES for s in c.stages}) == len(STAGES)


@pytest.mark.xdist_group("saved-runs")
@pytest.mark.parametrize("source, stage, old", [("07", "08", False), ("08", "07", False), ("07", "08", True)])
def test_stages_07_and_08_resume_each_others_rings(source, stage, old, saved, tmp_path, monkeypatch):
    """What a ring holds goes across in the other stage's form: every sampleable transition;
    a checkpoint and ring written before their ``belongs`` entries (``old``) too."""
    from lib.run import runner

    folder = tmp_path / "run"
    shutil.copytree(saved[source], folder)
    if old:
        to_old_format(folder)
    ring = torch.load(folder / "replay-16.pt", weights_only=True)
    seen = {}
    attach = runner.Run.attach

    def spy(self, buffer=None, **objects):
        attach(self, buffer=buffer, **objects)
        seen["len"] = len(buffer)
        seen["frames"] = buffer.state_dict()["frames"].clone() if stage == "08" else None

    monkeypatch.setattr(runner.Run, "attach", spy)
    res = run_inprocess(stage, "--resume", folder / "checkpoint.pt", "--max-frames", 20, "--quiet")
    assert res.code == 0, res.stderr
    assert f"with its replay buffer of {seen['len']} transitions, converted from stage {source}'s" in res.stdout
    if stage == "08":
        assert torch.equal(seen["frames"], torch.cat([r["frames"] for r in ring["streams"]]))
        assert seen["len"] == sum(r["transitions"] for r in ring["streams"])
    else:
        assert seen["len"] == int(ring["transitions"].sum())
    assert torch.load(folder / "checkpoint.pt", weights_only=True)["belongs"]["layout"] == (
        "device" if stage == "08" else "rings"
    )


def test_a_resume_keeps_its_seed_and_records_a_knob_given_again(tmp_path):
    """A resume of a seed-0 checkpoint with --seed 7 used to run and file itself as seed 7: it
    is refused in one line (exit 2). Without --seed it goes on with seed 0; --steps and
    --replay-size given again with other values are taken, and said, old and new, in a line
    and in summary.json's ``changed``."""
    first = run_inprocess("02", "--run-dir", tmp_path, "--max-frames", 32, "--replay-size", 128, "--replay-initial",
                          16, "--save-every", 16, "--quiet")  # fmt: skip
    assert first.code == 0, first.stderr
    folder = run_folder(tmp_path)
    ckpt = folder / "checkpoint.pt"
    before = sorted(p.name for p in folder.iterdir())
    res = run_inprocess("02", "--resume", ckpt, "--seed", 7, "--max-frames", 64)
    assert res.code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [
        f"02_play_steps.py: error: --resume {ckpt}: the checkpoint is of seed 0, not 7 (a run goes on with its seed)"
    ]
    assert sorted(p.name for p in folder.iterdir()) == before  # nothing created
    res = run_inprocess("02", "--resume", ckpt, "--max-frames", 64, "--steps", 2, "--replay-size", 256, "--quiet")
    assert res.code == 0, res.stderr
    assert "resumed with changes from the checkpoint: --steps 4 -> 2, --replay-size 128 -> 256" in res.stdout
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["seed"] == 0 and summary["knobs"]["steps"] == 2
    assert summary["changed"] == {"steps": [4, 2], "replay_size": [128, 256]}
    # Resumed again with another change: every resume's changes are kept, in order, in summary.json
    # and the checkpoints (only the last one's used to be), and each has its line in run.log.
    frame = torch.load(ckpt, weights_only=False)["frame_idx"]
    res = run_inprocess("02", "--resume", ckpt, "--max-frames", 96, "--steps", 1, "--quiet")
    assert res.code == 0, res.stderr
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["changed"] == {"steps": [2, 1]}
    resumes = [{k: r[k] for k in ("frame", "changed", "ring")} for r in summary["resumes"]]
    assert resumes == [
        {"frame": 32, "changed": {"steps": [4, 2], "replay_size": [128, 256]}, "ring": False},
        {"frame": frame, "changed": {"steps": [2, 1]}, "ring": False},
    ]
    lines = [line.split(" ", 1)[1] for line in (folder / "run.log").read_text().splitlines()]
    assert lines == [
        "resumed 02 at frame 32 (replay buffer refilled); changes: --steps 4 -> 2, --replay-size 128 -> 256",
        f"resumed 02 at frame {frame} (replay buffer refilled); changes: --steps 2 -> 1",
    ]


@pytest.mark.parametrize(
    "stage, argv, need",
    [
        ("03", ["--replay-size", "100000"], "the replay ring of 100000 slots, 1 game(s) and its play process need about 1.2 GiB"),
        ("07", ["--envs", "512", "--replay-size", "20000"],
         "the replay ring of 20000 slots, 512 game(s) and its play process need about 2.6 GiB"),
    ],
)  # fmt: skip
def test_the_memory_check_counts_the_games_and_the_play_process(stage, argv, need, tmp_path, monkeypatch):
    """With 1 GiB available: 03's ring of 100,000 slots (0.66 GiB) fits alone, not with its play
    process beside it (the check counted the ring and the games only); 07's 512 games (4 MiB
    each) and play process come to 2.6 GiB. One line, exit 2, nothing created."""
    monkeypatch.setattr(cli, "available_memory", lambda: 2**30)
    res = run_inprocess(stage, "--run-dir", tmp_path / "runs", *argv)
    assert res.code == 2 and res.stdout == ""
    assert res.stderr.splitlines() == [f"{STAGES[stage].script}: error: {need}; this machine has 1.0 GiB available"]
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    "command, argv",
    [
        ("lib.bench.command", ["--qui"]),
        ("lib.bench.trainstep", ["--cap", "none"]),
        ("lib.bench.table", ["--ful"]),
        ("lib.sweep.command", ["--stages", "01", "--max-fr", "10"]),
        ("lib.analysis.curves", ["runs", "--out", "x.png", "--lab", "a"]),
        ("lib.analysis.watch", ["model.pt", "--epis", "1"]),
    ],
)
def test_every_command_refuses_an_abbreviated_option(command, argv, capsys):
    """argparse reads ``--prec`` as ``--precision`` unless told not to: every command refuses an
    abbreviation in one line, exit 2, so that what a user typed is what ran."""
    import importlib

    try:
        code = importlib.import_module(command).main(argv)
    except SystemExit as e:  # the bench ends itself with its exit code
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unrecognized arguments" in err[0], err


def test_a_knob_given_on_a_resume_is_known_from_the_parser():
    """What a user gave is the parser's reading, not a scan of the argv strings: ``--precision=fp32``
    and ``--precision fp32`` are both given, a value of a flag that looks like a flag is not."""
    from lib.run.stage_args import make_parser

    parser = make_parser("08", None)
    _, given = parser.parse_given(["--precision=fp32", "--seed", "3"])
    assert {"--precision", "--seed"} <= given and "--steps" not in given
    _, given = parser.parse_given(["--run-dir=--steps"])  # a folder named --steps
    assert "--steps" not in given and "--run-dir" in given


def test_envs_on_a_07_to_08_resume_is_refused_with_a_ring_and_taken_without(tmp_path):
    """docs/reliability.md's rule: 08 resuming 07's checkpoint with another --envs is refused in
    one line where the checkpoint holds a ring (a ring per game: the count is the ring's), and
    taken, and recorded, where it holds none (the buffer is refilled anyway)."""
    ringless = tuple(a for a in TINY if a != "--save-replay")
    assert run_inprocess("07", "--run-dir", tmp_path / "ring", *TINY).code == 0
    assert run_inprocess("07", "--run-dir", tmp_path / "none", *ringless).code == 0
    with_ring, without = (
        run_folder(tmp_path / "ring") / "checkpoint.pt",
        run_folder(tmp_path / "none") / "checkpoint.pt",
    )
    res = run_inprocess("08", "--resume", with_ring, "--envs", 2, "--max-frames", 32)
    assert res.code == 2 and res.stderr.splitlines() == [
        "08_graph_learner.py: error: --envs 2: the checkpoint's replay buffer has 4"
    ], res.stderr
    res = run_inprocess("08", "--resume", without, "--envs", 2, "--max-frames", 32, "--quiet")
    assert res.code == 0, res.stderr
    assert "resumed with changes from the checkpoint: --envs 4 -> 2" in res.stdout
    assert res.outcome.summary["resumes"][-1]["changed"] == {"envs": [4, 2]}
