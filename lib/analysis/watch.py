"""Watch a saved network play: real games, greedy by default, optionally recorded to video.

``python -m lib.analysis.watch MODEL [--episodes K] [--video DIR] [--gif FILE [--gif-start S] [--gif-seconds S]]
[--device cpu|cuda|auto] [--seed N] [--max-steps N] [--epsilon E]``

MODEL is a ``best.pt``/``model.pt`` written by ``Run.save_model`` (kind
"dqn-speedup-model") or a ``checkpoint.pt`` (kind "dqn-speedup-checkpoint"). The env is
built with the wrapper set the network was trained on (the file's ``wrappers``):

- "old" / "new": ``lib.wrappers.make_env``. An episode here is a real *game*: it ends when
  ``info`` has ``game_return`` (a lost life only resets the learner's episode), and its
  reward is that unclipped score.
- "vector": ``ale_py.vector_env.AtariVectorEnv`` with ``num_envs=1`` and the preprocessing of
  stage 07's ``make_vector_env`` (skip 4, max-pool, stack 4 of 84x84 grey, ``noop_max=30``, fire
  reset, no episodic life, no reward clipping), but without its ``life_loss_info``: here
  ``terminated`` means game over, so an episode is a game and the sum of its (unclipped)
  rewards is its score. ``rom`` is the env id in snake case without prefix and suffix
  ("PongNoFrameskip-v4" -> "pong", "SpaceInvadersNoFrameskip-v4" -> "space_invaders").
  ``--video`` records a twin of that env, made with the same settings but RGB screens
  (``make_vector_env(..., screen=True)``), seeded and stepped with the agent's env: the same
  games, step for step (``tests/test_watch.py`` checks it).

``--max-steps`` caps the agent steps of each game (default 27,000 = 108,000 emulator frames,
the usual Atari evaluation cap and AtariVectorEnv's own default, so a stuck policy cannot
hang); a capped game counts as ended and reports its score so far.

``--video DIR`` wraps the env in ``gymnasium.wrappers.RecordVideo`` (render_mode
"rgb_array"; the vector env: its twin's screens), one ``<model>-episode-<k>.mp4`` per game; it
needs moviepy (the ``video`` extra). Frames are the screen after each agent step, i.e. every 4th emulator frame, so the
video runs at 15 f/s to play in real time (the emulator runs at 60).

``--gif FILE`` writes the first game's screens from ``--gif-start`` seconds (default 0) for
``--gif-seconds`` (default 30) as an animated GIF that loops, at the video's 15 f/s (delays of 7, 7
and 6 hundredths of a second in turn: a GIF counts in hundredths). Its palette is the screens' own
colours where they are 256 or fewer (Pong has 5, so the GIF is exact), else Pillow's median cut of them. It
needs no moviepy (Pillow comes with matplotlib); half a minute of Pong is about 100 kB.

After the games it prints how many units of each of the net's ReLU layers the states played made
active (``lib.model.ActiveUnits``), and names a layer with none: such a net's Q is the same for
every state, and it can no longer learn (no gradient reaches below that layer).

Bad input (missing, unreadable or foreign file, a net that does not fit the env, no CUDA for
``--device cuda``, no moviepy for ``--video``) ends the program with one line on stderr and
exit code 2, before anything is played.
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import os
import sys
import warnings

import numpy as np
import torch

from lib import vector_env
from lib.model import ActiveUnits
from lib.run import cli
from lib.run.checkpoint import CHECKPOINT_KIND, MODEL_KIND, read_file
from lib.run.cli import EXIT_SIGINT, UsageError

WRAPPER_SETS = ("old", "new", "vector")
DEFAULT_MAX_STEPS = 27_000  # agent steps = 108,000 emulator frames (30 emulated minutes)
VIDEO_FPS = 15  # one frame per agent step = every 4th frame of the 60 Hz emulator
GIF_DELAYS_MS = (70, 70, 60)  # a GIF's delays are whole hundredths of a second: these average 1/15 s


def _epsilon(value: str) -> float:
    try:
        e = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}")
    if not 0.0 <= e <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1], got {e}")
    return e


def _seed(value: str) -> int:
    """argparse type: a seed ale-py takes (an int32, for its vector env's games too)."""
    return cli.seed(value, cli.INT32_MAX)


def _parse(argv):
    p = cli.Parser(prog="watch", description="play real games with a saved network")
    p.add_argument("model", metavar="MODEL", help="best.pt / model.pt / checkpoint.pt of a run")
    p.add_argument("--episodes", type=cli.positive, default=1, help="games to play (default 1)")
    p.add_argument("--video", default=None, metavar="DIR", help="record each game to DIR (needs moviepy)")
    p.add_argument("--gif", default=None, metavar="FILE", help="the first game's screens as an animated GIF")
    p.add_argument(
        "--gif-start", type=cli.non_negative_float, default=0.0, metavar="S", help="the GIF from S s into the game"
    )
    p.add_argument(
        "--gif-seconds", type=cli.non_negative_float, default=30.0, metavar="S", help="the GIF's length (default 30 s)"
    )
    cli.add_device(p)
    p.add_argument("--seed", type=_seed, default=0, help="seeds the env's first reset and the random actions")
    p.add_argument("--max-steps", type=cli.positive, default=DEFAULT_MAX_STEPS, help="cap on agent steps per game")
    p.add_argument("--epsilon", type=_epsilon, default=0.0, help="probability of a random action (default 0)")
    return p.parse_args(argv)


def load_model(path: str) -> dict:
    """The file as {stage, game, env_name, wrappers, frame_idx, net}; UsageError if it is not
    a model or checkpoint of this project."""
    data = read_file(path, path, "model file")
    kind = data.get("kind") if isinstance(data, dict) else None
    try:
        if kind == MODEL_KIND:
            env_name = data["env_name"]
        elif kind == CHECKPOINT_KIND:
            env_name = data["params"]["env_name"]
        else:
            raise UsageError(f"{path}: not a dqn-speedup model or checkpoint")
        info = {
            "stage": data.get("stage", "?"),
            "game": data["game"],
            "env_name": env_name,
            "wrappers": data["wrappers"],
            "frame_idx": data.get("frame_idx"),
            "net": data["net"],
        }
    except KeyError as e:
        raise UsageError(f"{path}: a {kind} file without the key {e}")
    except TypeError:
        raise UsageError(f"{path}: a {kind} file whose params are not a dict")
    if not isinstance(env_name, str):
        raise UsageError(f"{path}: env_name {env_name!r} is not an env id")
    if info["wrappers"] not in WRAPPER_SETS:
        raise UsageError(f"{path}: unknown wrapper set {info['wrappers']!r} (known: {', '.join(WRAPPER_SETS)})")
    if not isinstance(info["net"], dict):
        raise UsageError(f"{path}: 'net' is not a state dict")
    return info


def _layer(env, cls):
    """The wrapper of type ``cls`` inside ``env``'s stack."""
    while not isinstance(env, cls):
        env = env.env
    return env


def _check_outputs(args) -> None:
    if args.video is not None:
        if importlib.util.find_spec("moviepy") is None:
            raise UsageError("--video needs moviepy, which is not installed: pip install -e '.[video]'")
        _check_writable("--video", args.video, folder=True)
    if args.gif is not None:
        if not args.gif.lower().endswith(".gif"):
            raise UsageError(f"--gif {args.gif}: the file's name must end in .gif")
        if args.gif_seconds <= 0:
            raise UsageError("--gif-seconds: a GIF needs more than 0 seconds")
        _check_writable("--gif", args.gif, folder=False)


def _check_writable(flag: str, path: str, folder: bool) -> None:
    """``path`` (a folder, or a file) can be made or written: its first existing ancestor is a
    writable folder, and it is not a file where a folder is wanted or the other way round."""
    target = os.path.abspath(path)
    if os.path.exists(target) and os.path.isdir(target) != folder:
        raise UsageError(f"{flag} {path}: exists and is not a {'folder' if folder else 'file'}")
    probe = target if folder else os.path.dirname(target)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise UsageError(f"{flag} {path}: {probe} is not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {probe} is not writable")


class Clip:
    """The screens of a stretch of one game, ``start`` s in, for ``seconds`` s at VIDEO_FPS:
    ``add`` is given every screen of the game from its reset on and keeps those in the stretch."""

    def __init__(self, path: str, start: float, seconds: float):
        self.path = path
        self.first = round(start * VIDEO_FPS)
        self.end = self.first + max(1, round(seconds * VIDEO_FPS))
        self.seen = 0
        self.frames: list[np.ndarray] = []

    def add(self, screen: np.ndarray) -> None:
        if self.first <= self.seen < self.end:
            self.frames.append(np.array(screen, dtype=np.uint8, copy=True))
        self.seen += 1

    def write(self) -> int:
        """The GIF written; its size in bytes."""
        return write_gif(self.frames, self.path)


class _Wrapped:
    """Real games on a make_env stack ("old"/"new")."""

    def __init__(self, env_name, new_wrappers, video, prefix, seed, clip=None):
        from lib import wrappers

        self.wrappers = wrappers
        screens = video is not None or clip is not None
        self.env = wrappers.make_env(env_name, new_wrappers=new_wrappers, render_mode="rgb_array" if screens else None)
        self.screen, self.clip = self.env.render, clip  # the screen after the last step, as RecordVideo films it
        self.video = None
        if video:
            from gymnasium.wrappers import RecordVideo

            # Recording is started per game by hand (no trigger) and never cut by length, so
            # that a lost life, which resets the learner's episode, stays in the game's video.
            self.env = self.video = RecordVideo(
                self.env, video, episode_trigger=lambda _: False, video_length=2**62, name_prefix=prefix, fps=VIDEO_FPS
            )
        self.n_actions = self.env.action_space.n
        self.env.action_space.seed(seed)
        self.seed = seed
        self.games = 0

    def play(self, net, epsilon, device, rng, max_steps):
        from lib.agent import choose_action

        if self.games > 0:
            # After a capped game the life-loss wrapper would only continue it: force a real reset.
            _layer(self.env, self.wrappers.EpisodicLife).was_real_done = True
        self.games += 1
        if self.video is not None:
            self.video.start_recording(f"{self.video.name_prefix}-episode-{self.games}")
        state, _ = self.env.reset(seed=self.seed if self.games == 1 else None)
        clip = self.clip if self.games == 1 else None
        if clip is not None:
            clip.add(self.screen())
        for steps in range(1, max_steps + 1):
            action = choose_action(net, state, epsilon, self.env.action_space, device, rng)
            state, _, terminated, truncated, info = self.env.step(action)
            if clip is not None:
                clip.add(self.screen())
            if "game_return" in info:
                return float(info["game_return"]), steps, False
            if terminated or truncated:
                state, _ = self.env.reset()
        return float(_layer(self.env, self.wrappers.GameStats)._return), max_steps, True

    def close(self):
        self.env.close()  # RecordVideo writes the last video here


class _Vector:
    """Real games on a one-env AtariVectorEnv ("vector"); with ``video``, its screens from a twin."""

    def __init__(self, env_name, seed, video=None, prefix="model", clip=None):
        from ale_py import roms

        rom = vector_env.rom_name(env_name)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if roms.get_rom_path(rom) is None:
                raise UsageError(f"env {env_name!r}: no ALE ROM named {rom!r} for the vector env")
        # Stage 07's settings, except that ``terminated`` here means game over.
        self.env = vector_env.make_vector_env(env_name, 1, life_loss_info=False)
        screens = video is not None or clip is not None
        self.twin = vector_env.make_vector_env(env_name, 1, life_loss_info=False, screen=True) if screens else None
        self.video, self.prefix, self.clip, self.screens = video, prefix, clip, []
        self.n_actions = self.env.single_action_space.n
        self.seed = seed
        self.games = 0

    def play(self, net, epsilon, device, rng, max_steps):
        from lib.actor import choose_actions

        self.games += 1
        seed = self.seed if self.games == 1 else None
        obs, _ = self.env.reset(seed=seed)
        clip = self.clip if self.games == 1 else None
        if self.twin is not None:  # reset and stepped alike, its games stay the agent's
            self._screen(self.twin.reset(seed=seed)[0][0, -1], clip)
        score = 0.0
        try:
            for steps in range(1, max_steps + 1):
                actions = choose_actions(net, obs, epsilon, self.n_actions, device, rng)
                obs, reward, terminated, truncated, _ = self.env.step(actions)
                if self.twin is not None:
                    self._screen(self.twin.step(actions)[0][0, -1], clip)
                score += float(reward[0])
                if terminated[0] or truncated[0]:
                    return score, steps, False
            return score, max_steps, True
        finally:
            self._write_video()

    def _screen(self, screen, clip) -> None:
        if self.video is not None:
            self.screens.append(screen)
        if clip is not None:
            clip.add(screen)

    def _write_video(self) -> None:
        """The game's screens as ``<prefix>-episode-<k>.mp4`` in the video folder."""
        if self.video is None or not self.screens:
            return
        write_video(self.screens, os.path.join(self.video, f"{self.prefix}-episode-{self.games}.mp4"))
        self.screens = []

    def close(self):
        self.env.close()
        if self.twin is not None:
            self.twin.close()


def write_video(frames: list, path: str) -> None:
    """RGB frames, one an agent step, as a video at VIDEO_FPS (moviepy, as RecordVideo writes)."""
    from moviepy import ImageSequenceClip

    os.makedirs(os.path.dirname(path), exist_ok=True)
    ImageSequenceClip(list(frames), fps=VIDEO_FPS).write_videofile(path, logger=None)


def write_gif(frames: list, path: str) -> int:
    """RGB frames, one an agent step, as a looping animated GIF at VIDEO_FPS; its size in bytes.
    The palette is the frames' own colours where they are 256 or fewer, else a median cut of them."""
    from PIL import Image

    if not frames:
        raise ValueError("a GIF needs at least one frame")
    stack = np.stack(frames)
    colours = np.unique(stack.reshape(-1, 3), axis=0)
    if len(colours) <= 256:
        palette = Image.new("P", (1, 1))
        palette.putpalette(colours.astype(np.uint8).tobytes())
    else:  # a tall strip of up to 64 frames spread over the clip stands for all of them
        sample = stack[np.linspace(0, len(stack) - 1, min(64, len(stack))).astype(int)]
        palette = Image.fromarray(sample.reshape(-1, stack.shape[2], 3)).quantize(256)
    images = [Image.fromarray(f).quantize(palette=palette, dither=Image.Dither.NONE) for f in stack]
    delays = list(itertools.islice(itertools.cycle(GIF_DELAYS_MS), len(images)))
    parent = os.path.dirname(os.path.abspath(path))
    os.makedirs(parent, exist_ok=True)
    images[0].save(path, format="GIF", save_all=True, append_images=images[1:], duration=delays, loop=0)
    return os.path.getsize(path)


def _build(args, info, device, clip=None):
    """Env and net, checked to fit each other; nothing is played here."""
    from lib.model import DQN

    prefix = os.path.splitext(os.path.basename(args.model))[0]
    if info["wrappers"] == "vector":
        games = _Vector(info["env_name"], args.seed, args.video, prefix, clip)
    else:
        if not cli.env_exists(info["env_name"]):
            raise UsageError(f"{args.model}: env id {info['env_name']!r} does not exist")
        games = _Wrapped(info["env_name"], info["wrappers"] == "new", args.video, prefix, args.seed, clip)
    net = DQN((4, 84, 84), games.n_actions)
    try:
        net.load_state_dict(info["net"])
    except (RuntimeError, KeyError, TypeError, AttributeError, ValueError) as e:
        games.close()
        head = info["net"].get("fc.2.weight")
        if isinstance(head, torch.Tensor) and head.dim() == 2 and head.shape[0] != games.n_actions:
            why = f"it has {head.shape[0]} actions, the env {games.n_actions}"
        else:
            lines = [s.strip() for s in str(e).strip().splitlines()]
            why = lines[1] if len(lines) > 1 else (lines[0] if lines and lines[0] else type(e).__name__)
        raise UsageError(f"{args.model}: the saved net does not fit {info['env_name']}: {why}")
    return games, net.to(device).eval()


def _main(argv) -> int:
    args = _parse(argv)
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner: errors stay one line
    info = load_model(args.model)
    device = cli.resolve_device(args.device)
    _check_outputs(args)
    if device.type == "cpu":
        # One state per forward pass: a second thread does not speed it up, and next to a
        # training run it makes each step many times slower by contending for the cores.
        torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    clip = None if args.gif is None else Clip(args.gif, args.gif_start, args.gif_seconds)
    games, net = _build(args, info, device, clip)
    frame = "" if info["frame_idx"] is None else f", saved at frame {info['frame_idx']}"
    print(
        f"{args.model}: stage {info['stage']} {info['game']} ({info['env_name']}, {info['wrappers']} wrappers"
        f"{frame}) on {device}, epsilon {args.epsilon:g}",
        flush=True,
    )
    units = ActiveUnits(net)  # which of its units the games' states reach
    scores = []
    code = 0
    try:
        for k in range(1, args.episodes + 1):
            score, steps, capped = games.play(net, args.epsilon, device, rng, args.max_steps)
            scores.append(score)
            print(f"episode {k}: reward {score:.1f} ({steps} steps{', capped' if capped else ''})", flush=True)
    except KeyboardInterrupt:
        code = EXIT_SIGINT
        print("interrupted", flush=True)
    finally:
        games.close()
    if scores:
        games_word = "episode" if len(scores) == 1 else "episodes"
        print(f"mean reward over {len(scores)} {games_word}: {np.mean(scores):.3f}", flush=True)
    report_units(units)
    if args.video is not None:
        print(f"videos in {args.video}", flush=True)
    if clip is not None:
        if not clip.frames:
            seconds = clip.seen / VIDEO_FPS
            print(f"watch: no GIF: the first game lasted {seconds:.1f} s, --gif-start is {args.gif_start:g} s",
                  file=sys.stderr, flush=True)  # fmt: skip
            return code or 1
        try:
            size = clip.write()
        except OSError as e:
            print(f"watch: cannot write the GIF {args.gif}: {e.strerror or e}", file=sys.stderr, flush=True)
            return code or 1
        seconds = len(clip.frames) / VIDEO_FPS
        print(f"gif: {args.gif} ({len(clip.frames)} frames, {seconds:.1f} s from {args.gif_start:g} s, "
              f"{size / 1024:.0f} kB)", flush=True)  # fmt: skip
    return code


def report_units(units: ActiveUnits) -> None:
    """The units the played states made active, layer by layer; a layer with none is named with
    what it means for the net. Nothing when no state went through the net (every action random)."""
    counts = units.counts()
    if not counts:
        return
    print("units active on the states played: " + ", ".join(f"{n} {a}/{t}" for n, a, t in counts), flush=True)
    for name in units.dead():
        print(
            f"no unit of {name} is active on any state played: this net's Q is the same for every state "
            "and no gradient reaches the layers below it, so it cannot learn again (docs/learning.md)",
            flush=True,
        )


def main(argv=None) -> int:
    try:
        return _main(argv)
    except UsageError as e:
        return cli.usage_exit("watch", e)


if __name__ == "__main__":
    sys.exit(main())
