"""lib.analysis.watch: plays capped games from saved files of every kind and wrapper set; bad files
exit 2 with one line on stderr."""

import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from lib import wrappers
from lib.analysis import watch
from lib.model import DQN
from lib.run.cli import ROOT

PONG_ACTIONS = 6


def _net_state(n_actions=PONG_ACTIONS):
    torch.manual_seed(0)
    return DQN((4, 84, 84), n_actions).state_dict()


def _model_file(path, wrappers_set="new", n_actions=PONG_ACTIONS):
    """What Run.save_model writes (best.pt / model.pt)."""
    payload = {
        "kind": "dqn-speedup-model",
        "stage": "05",
        "game": "pong",
        "env_name": "PongNoFrameskip-v4",
        "wrappers": wrappers_set,
        "frame_idx": 1234,
        "mean_reward": -20.5,
        "net": _net_state(n_actions),
    }
    torch.save(payload, path)
    return str(path)


def _played(capsys, argv):
    assert watch.main(argv) == 0
    return capsys.readouterr().out


def test_best_pt_new_wrappers(tmp_path, capsys):
    model = _model_file(tmp_path / "best.pt")
    out = _played(capsys, [model, "--episodes", "1", "--max-steps", "200", "--device", "cpu"])
    assert "stage 05 pong (PongNoFrameskip-v4, new wrappers, saved at frame 1234) on cpu" in out
    # 200 agent steps are far from the end of a Pong game: the cap ends it, with its score so far.
    line = re.search(r"^episode 1: reward (-?\d+\.\d) \(200 steps, capped\)$", out, re.M)
    assert line, out
    assert -21.0 <= float(line.group(1)) <= 0.0  # an untrained net does not win points in 200 steps
    assert re.search(rf"^mean reward over 1 episode: {float(line.group(1)):.3f}$", out, re.M)
    units = re.search(
        r"^units active on the states played: conv1 (\d+)/32, conv2 (\d+)/64, conv3 (\d+)/64, fc1 (\d+)/512$", out, re.M
    )
    assert units and min(int(n) for n in units.groups()) > 0 and "no unit of" not in out, out


def test_a_net_whose_last_conv_layer_is_dead_is_named(tmp_path, capsys):
    """A net none of whose last conv layer's channels is active (what stage 01 at lr 1e-4 comes
    to on some seeds): watch says so, and its Q is the same for every state played."""
    state = _net_state()
    state["conv.4.weight"].zero_()
    state["conv.4.bias"].fill_(-1.0)
    model = tmp_path / "best.pt"
    torch.save({"kind": "dqn-speedup-model", "stage": "01", "game": "pong", "env_name": "PongNoFrameskip-v4",
                "wrappers": "old", "frame_idx": 16000, "mean_reward": -21.0, "net": state}, model)  # fmt: skip
    out = _played(capsys, [str(model), "--max-steps", "50", "--device", "cpu"])
    assert re.search(
        r"^units active on the states played: conv1 \d+/32, conv2 \d+/64, conv3 0/64, fc1 \d+/512$", out, re.M
    ), out
    assert re.search(
        r"^no unit of conv3 is active on any state played: this net's Q is the same for every state", out, re.M
    )


def test_checkpoint_old_wrappers(tmp_path, capsys):
    ckpt = {
        "kind": "dqn-speedup-checkpoint",
        "stage": "01",
        "game": "pong",
        "wrappers": "old",
        "params": {"env_name": "PongNoFrameskip-v4"},
        "frame_idx": 50,
        "net": _net_state(),
        "tgt_net": _net_state(),
    }
    torch.save(ckpt, tmp_path / "checkpoint.pt")
    out = _played(capsys, [str(tmp_path / "checkpoint.pt"), "--episodes", "2", "--max-steps", "20"])
    assert "old wrappers" in out
    assert len(re.findall(r"^episode [12]: reward -?\d+\.\d \(20 steps, capped\)$", out, re.M)) == 2


def test_vector_wrappers(tmp_path, capsys):
    model = _model_file(tmp_path / "model.pt", wrappers_set="vector")
    out = _played(capsys, [model, "--max-steps", "30", "--epsilon", "0.5", "--seed", "3"])
    assert "vector wrappers" in out and "epsilon 0.5" in out
    assert re.search(r"^episode 1: reward -?\d+\.\d \(30 steps, capped\)$", out, re.M)


def test_rom_name():
    from lib.vector_env import rom_name

    assert rom_name("PongNoFrameskip-v4") == "pong"
    assert rom_name("SpaceInvadersNoFrameskip-v4") == "space_invaders"
    assert rom_name("ALE/Breakout-v5") == "breakout"


def test_game_after_a_capped_game_starts_fresh():
    # A capped game ends mid-game; without a forced real reset the life-loss wrapper's reset
    # would only continue it. After two games of 30 agent steps the emulator's episode frame
    # counter must be at most 30 no-ops + 2 fire-reset steps * 4 + 30 steps * 4 = 158, not 240+.
    games = watch._Wrapped("PongNoFrameskip-v4", True, None, "x", seed=0)
    net = DQN((4, 84, 84), games.n_actions)
    rng = np.random.default_rng(0)
    for _ in range(2):
        _, steps, capped = games.play(net, 0.0, torch.device("cpu"), rng, 30)
        assert (steps, capped) == (30, True)
    assert games.env.unwrapped.ale.getEpisodeFrameNumber() <= 158
    assert watch._layer(games.env, wrappers.GameStats)._steps <= 158
    games.close()


def _one_line_exit_2(argv, capsys):
    code = watch.main(argv)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("watch: error: "), err
    return err


def test_not_a_model_and_wrong_game(tmp_path, capsys):
    torch.save({"kind": "something-else", "net": {}}, tmp_path / "other.pt")
    assert "not a dqn-speedup model" in _one_line_exit_2([str(tmp_path / "other.pt")], capsys)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    assert "not a dqn-speedup model" in _one_line_exit_2([str(tmp_path / "list.pt")], capsys)
    # A Breakout-sized head (4 actions) does not fit Pong's 6.
    model = _model_file(tmp_path / "best.pt", n_actions=4)
    assert "it has 4 actions, the env 6" in _one_line_exit_2([model], capsys)


@pytest.mark.parametrize("seed", ["2147483648", "99999999999999999999"])
def test_a_seed_beyond_ale_pys_range_is_refused(seed, tmp_path, capsys):
    """ale-py seeds its games with an int32 (its vector env consecutive ones from it)."""
    model = _model_file(tmp_path / "model.pt", wrappers_set="vector")
    assert "--seed: expected a number from 0 to 2147483647" in _one_line_exit_2([model, "--seed", seed], capsys)


def test_video_refused_without_moviepy(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(watch.importlib.util, "find_spec", lambda name: None)
    for wrappers_set in ("new", "vector"):
        model = _model_file(tmp_path / "best.pt", wrappers_set=wrappers_set)
        assert "moviepy" in _one_line_exit_2([model, "--video", str(tmp_path / "v")], capsys)
    assert not (tmp_path / "v").exists()


def test_a_vector_nets_video_is_the_games_it_played(tmp_path, capsys, monkeypatch):
    """A net of 07-08 plays the vector env it was trained on; --video records a twin of it made
    with the same settings but RGB screens, reset and stepped alike: one screen a step, the
    reset's included, for each game. (The writer is moviepy's; here it only keeps the frames.)"""
    real = watch.importlib.util.find_spec
    monkeypatch.setattr(watch.importlib.util, "find_spec", lambda name: True if name == "moviepy" else real(name))
    videos = {}
    monkeypatch.setattr(watch, "write_video", lambda frames, path: videos.setdefault(path, list(frames)))
    model = _model_file(tmp_path / "model.pt", wrappers_set="vector")
    argv = [model, "--video", str(tmp_path / "v"), "--episodes", "2", "--max-steps", "60", "--epsilon", "1"]
    out = _played(capsys, [*argv, "--device", "cpu"])
    assert sorted(videos) == [str(tmp_path / "v" / f"model-episode-{k}.mp4") for k in (1, 2)]
    steps = [int(s) for s in re.findall(r"\((\d+) steps", out)]
    assert [len(videos[p]) for p in sorted(videos)] == [n + 1 for n in steps]
    assert all(f.shape == (210, 160, 3) and f.dtype == np.uint8 for v in videos.values() for f in v)


def test_the_screen_twin_plays_the_agents_games():
    """The twin (``make_vector_env(..., screen=True)``) seeded and stepped as the agent's env is in
    the same game at every step: the same rewards and game ends, and its screen, made grey and
    84x84, is the agent's newest frame (mean difference under half a grey level; measured 0.02)."""
    import cv2

    from lib.vector_env import make_vector_env

    agent = make_vector_env("PongNoFrameskip-v4", 1, life_loss_info=False)
    twin = make_vector_env("PongNoFrameskip-v4", 1, life_loss_info=False, screen=True)

    def grey(screen):
        return cv2.resize(cv2.cvtColor(screen, cv2.COLOR_RGB2GRAY), (84, 84), interpolation=cv2.INTER_AREA)

    obs, _ = agent.reset(seed=3)
    screen, _ = twin.reset(seed=3)
    rng = np.random.default_rng(1)
    for _ in range(300):
        assert np.abs(grey(screen[0, -1]).astype(int) - obs[0, -1]).mean() < 0.5
        actions = rng.integers(0, PONG_ACTIONS, size=1)
        obs, reward, terminated, truncated, _ = agent.step(actions)
        screen, twin_reward, twin_terminated, twin_truncated, _ = twin.step(actions)
        assert (reward[0], terminated[0], truncated[0]) == (twin_reward[0], twin_terminated[0], twin_truncated[0])
    agent.close()
    twin.close()


@pytest.mark.parametrize("case", ["missing", "corrupt"])
def test_bad_file_subprocess(case, tmp_path):
    path = tmp_path / "best.pt"
    if case == "corrupt":
        path.write_bytes(b"not a torch file\x00\x01")
    proc = subprocess.run(
        [sys.executable, "-m", "lib.analysis.watch", str(path), "--max-steps", "10"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("watch: error: "), proc.stderr
    assert ("no such file" if case == "missing" else "not a readable model file") in lines[0]


def test_watch_plays_the_nets_argmax(tmp_path, capsys, monkeypatch):
    """A net whose head always prefers action 3 (RIGHT in Pong) makes every agent step of the
    game press 3: the emulator below the wrappers sees it on each of the 4 skipped frames."""
    state = _net_state()
    state["fc.2.weight"] = torch.zeros_like(state["fc.2.weight"])
    state["fc.2.bias"] = torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0])
    path = tmp_path / "best.pt"
    torch.save(
        {"kind": "dqn-speedup-model", "stage": "05", "game": "pong", "env_name": "PongNoFrameskip-v4",
         "wrappers": "new", "frame_idx": 1, "mean_reward": 0.0, "net": state},
        path,
    )  # fmt: skip
    seen = []
    step = wrappers.GameStats.step

    def record(self, action):
        seen.append(int(action))
        return step(self, action)

    monkeypatch.setattr(wrappers.GameStats, "step", record)
    _played(capsys, [str(path), "--max-steps", "25", "--device", "cpu"])
    # The reset pressed NOOP 1..30 times, then FIRE and action 2 (the fire reset), each an agent
    # step of 4 frames; then come the 25 agent steps of 4 frames each, all the net's.
    assert seen[-100:] == [3] * 100
    assert seen[-108:-100] == [1] * 4 + [2] * 4
    assert 1 <= len(seen) - 108 <= 30 and set(seen[:-108]) == {0}


def test_watch_plays_a_checkpoint_a_real_run_wrote(tmp_path, capsys):
    from tests.conftest import run_folder, run_inprocess

    res = run_inprocess("07", "--max-frames", 200, "--replay-initial", 100, "--save-every", 200, "--run-dir",
                        tmp_path / "runs", "--quiet")  # fmt: skip
    assert res.code == 0, res.stderr
    ckpt = run_folder(tmp_path / "runs") / "checkpoint.pt"
    info = watch.load_model(str(ckpt))
    assert info["wrappers"] == "vector" and info["frame_idx"] == 200 and info["stage"] == "07"
    trained = res.run.saveables["net"].state_dict()
    assert all(torch.equal(info["net"][k], trained[k]) for k in trained)
    out = _played(capsys, [str(ckpt), "--max-steps", "20", "--device", "cpu"])
    assert re.search(r"^episode 1: reward -?\d+\.\d \(20 steps, capped\)$", out, re.M)


def _gif_frames(path):
    """A GIF's frames as RGB arrays, each with its delay in ms."""
    from PIL import Image, ImageSequence

    with Image.open(path) as im:
        return [(np.asarray(f.convert("RGB")), f.info["duration"]) for f in ImageSequence.Iterator(im)]


def test_a_gif_is_the_stretch_of_the_first_game_asked_for(tmp_path, capsys, monkeypatch):
    """--gif keeps the first game's screens from --gif-start for --gif-seconds, colour for colour
    (Pong's few colours are the palette), at 15 f/s; a second game adds nothing. Checked against
    the twin's screens the video of the same games is made of."""
    real = watch.importlib.util.find_spec
    monkeypatch.setattr(watch.importlib.util, "find_spec", lambda name: True if name == "moviepy" else real(name))
    videos = {}
    monkeypatch.setattr(watch, "write_video", lambda frames, path: videos.setdefault(path, list(frames)))
    model = _model_file(tmp_path / "model.pt", wrappers_set="vector")
    gif = tmp_path / "clip" / "pong.gif"
    argv = [model, "--video", str(tmp_path / "v"), "--gif", str(gif), "--gif-start", "1", "--gif-seconds", "2"]
    out = _played(capsys, [*argv, "--episodes", "2", "--max-steps", "60", "--epsilon", "1", "--device", "cpu"])
    assert re.search(rf"^gif: {re.escape(str(gif))} \(30 frames, 2\.0 s from 1 s, \d+ kB\)$", out, re.M), out
    wanted = videos[str(tmp_path / "v" / "model-episode-1.mp4")][15:45]
    got = _gif_frames(gif)
    # Pillow writes a screen that repeats the one before as one frame with both delays.
    kept = [0] + [i for i in range(1, 30) if not np.array_equal(wanted[i], wanted[i - 1])]
    assert len(got) == len(kept)
    for (frame, delay), i, j in zip(got, kept, [*kept[1:], 30]):
        assert np.array_equal(frame, wanted[i])
        assert delay == sum(watch.GIF_DELAYS_MS[k % 3] for k in range(i, j))
    assert sum(d for _, d in got) == 2000  # 30 screens at 15 f/s


def test_a_gif_of_the_wrapped_sets_films_the_game_played(tmp_path, capsys):
    """With the 2017 set the screens come from the env's own render: 210x160 RGB, the reset's
    screen first; a stretch past the game's end leaves no GIF, one line and exit 1."""
    model = _model_file(tmp_path / "best.pt", wrappers_set="old")
    gif = tmp_path / "a.gif"
    out = _played(capsys, [model, "--gif", str(gif), "--max-steps", "40", "--device", "cpu"])
    assert re.search(r"^gif: .*a\.gif \(41 frames, 2\.7 s from 0 s, \d+ kB\)$", out, re.M), out
    frames = _gif_frames(gif)
    assert all(f.shape == (210, 160, 3) for f, _ in frames)
    assert sum(d for _, d in frames) == sum(watch.GIF_DELAYS_MS[k % 3] for k in range(41))
    assert watch.main([model, "--gif", str(tmp_path / "b.gif"), "--gif-start", "5", "--max-steps", "40"]) == 1
    err = capsys.readouterr().err
    assert err == "watch: no GIF: the first game lasted 2.7 s, --gif-start is 5 s\n"
    assert not (tmp_path / "b.gif").exists()


def test_write_gif_keeps_many_colours_close(tmp_path):
    """More than 256 colours: a median-cut palette, each pixel within a few levels of the original."""
    rng = np.random.default_rng(0)
    base = np.repeat(np.linspace(0, 255, 160, dtype=np.uint8)[None, :, None], 210, axis=0)
    frames = [np.concatenate([base, np.roll(base, 40 * k, 1), 255 - base], axis=2) for k in range(4)]
    frames[0][100:110, 50:60] = rng.integers(0, 256, (10, 10, 3), dtype=np.uint8)
    watch.write_gif(frames, str(tmp_path / "x.gif"))
    got = _gif_frames(tmp_path / "x.gif")
    assert len(got) == 4
    for (frame, _), want in zip(got, frames):
        err = np.abs(frame.astype(int) - want)
        assert err[:100].mean() < 4 and err[110:].mean() < 4


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--gif", "{tmp}/a.png"], "--gif {tmp}/a.png: the file's name must end in .gif"),
        (["--gif", "{tmp}/d.gif"], "--gif {tmp}/d.gif: exists and is not a file"),
        (["--gif", "{tmp}/a.gif", "--gif-seconds", "0"], "--gif-seconds: a GIF needs more than 0 seconds"),
        (["--gif", "{tmp}/a.gif", "--gif-start", "-1"], "--gif-start: expected a number >= 0, got -1"),
        (["--gif", "{tmp}/a.gif", "--gif-seconds", "inf"], "--gif-seconds: expected a number >= 0, got inf"),
        (["--gif", "{tmp}/f/a.gif"], "--gif {tmp}/f/a.gif: {tmp}/f is not a folder"),
    ],
)
def test_bad_gif_arguments_are_one_line(argv, says, tmp_path, capsys):
    (tmp_path / "d.gif").mkdir()
    (tmp_path / "f").write_text("a file")
    model = _model_file(tmp_path / "best.pt")
    err = _one_line_exit_2([model, *(a.replace("{tmp}", str(tmp_path)) for a in argv)], capsys)
    assert says.replace("{tmp}", str(tmp_path)) in err
