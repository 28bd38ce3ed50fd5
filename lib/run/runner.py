"""A stage's run, the skeleton every stage shares: validation, run folder, writer and tracker,
the frame loop that takes checkpoints when due, the end of the run, and ``main``, the one entry
point that turns a stage's outcome into the RESULT line, summary.json and an exit code. The
stage's command line is the registry's (``lib.run.stage_args.make_parser``); what a checkpoint holds is
``lib.run.checkpoint``'s; what each process sets first and the seeding are ``lib.run.runtime``'s; the
errors are ``lib.run.cli``'s.

A stage script is ``train(run)`` (its loop) plus ``main(argv)``, which calls ``runner.main``.
``Run`` raises and returns; it never ends the process, so a whole stage runs in-process too
(the tests do so). ``main`` checks everything (game, env id, numbers, knobs against each other
and against memory, device, run folder, checkpoint) before anything is created: bad input is
one line on stderr and exit 2. Once a run has started, Ctrl-C (130), SIGTERM (143) and SIGHUP
(129) stop it cleanly (``lib.run.signals``; one during a save waits for it): child processes are
ended, TensorBoard is flushed, and the RESULT line and summary are written, marked
interrupted. The run folder is the run's alone (``lib.run.runlock``). A file of the run that cannot be written (disk full, no
permission, folder gone) stops training with one line naming the file and the reason, exit
74; the last good checkpoint and model stay as they were and no ``.tmp`` file is left.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
import sys
import threading
import time
import traceback

import torch

from lib import precision
from lib.params import GAMES, Hyperparams
from lib.run import checkpoint, cli, game_state, memory, probes, procs, resume, runlock, signals
from lib.run import summary as run_summary
from lib.run.checkpoint import atomic_write, load_checkpoint
from lib.run.cli import EXIT_FAILED, EXIT_WRITE, DeviceError, RunError, Terminated, UsageError, WriteError, say
from lib.run.events import EventWriter
from lib.run.knobs import KNOBS
from lib.run.probes.best_model import BestModel
from lib.run.probes.trackers import RewardTracker, SpeedMeter
from lib.run.runtime import process_settings, set_seed
from lib.run.stage_args import make_parser
from lib.run.stages import STAGES
from lib.schedules import crossed


class Run:
    """One training run: validated settings, then (``start``) its folder, writer and tracker.

    ``Run(stage, args)`` only checks (UsageError); ``start()`` creates; ``close()`` ends child
    processes, takes the last checkpoint and writes the summary. ``parts(...)`` hands back the
    loop's parts as the run's probes measure them (``lib.run.probes``, the registry's ``probes``).
    ``frames(step)`` yields the agent-step counter and, between iterations, prints PROGRESS
    lines, takes checkpoints and lets the probes take their points;
    ``game_over`` reports a finished game, keeps the best model and says whether it is solved.
    """

    def __init__(self, stage: str, args, argv=None):
        self.stage = stage
        self.args = args
        self.given = {a.split("=", 1)[0] for a in (sys.argv[1:] if argv is None else argv) if a.startswith("--")}
        self.wrappers = STAGES[stage].wrappers
        self.prog = STAGES[stage].script
        self.children: list = []
        self.saveables: dict = {}
        self.solved_flag = False
        self.folder = None
        self.buffer = None
        self.env = None
        self.writer = None
        self.tracker = None
        self.lock = None  # the run folder's (``lib.run.runlock``), held from validation or start to the end
        self.stdout = None  # what main makes sys.stdout (``cli.DroppingStdout``): it counts the lines dropped
        self.fault = None  # a device failure the run's end met (``cli.DeviceError``)
        self._validate()
        self.frame_idx = self.start_frame
        self._last_save = self.start_frame
        self.best = BestModel(self.save_model)  # best.pt
        self.probes = probes.attach(self, STAGES[stage].probes)  # what the run measures (lib.run.probes)
        self.speed = SpeedMeter(on_start=self.probes["time_by_part"].clocks.mark)

    # -- validation: nothing is created here --------------------------------------------
    def _validate(self) -> None:
        args = self.args
        self.ckpt = load_checkpoint(args.resume) if args.resume else None
        self.changed = checkpoint.resume_settings(self.ckpt, args, self.given, STAGES[self.stage].knobs)
        game = args.game
        if self.ckpt is not None:
            if game is not None and game != self.ckpt["game"]:
                raise UsageError(
                    f"--resume {args.resume}: the checkpoint is for game {self.ckpt['game']!r}, not {game!r}"
                )
            game = self.ckpt["game"]
        game = game or "pong"
        if game not in GAMES:
            raise UsageError(f"unknown game {game!r} (known: {', '.join(GAMES)})")
        self.game = game
        params = GAMES[game]
        if self.ckpt is not None:
            params = Hyperparams(**self.ckpt["params"])
        if args.env is not None:
            if self.ckpt is not None:
                resume.check_resume_env(self.ckpt, args.resume, args.env)
            params = params.replace(env_name=args.env)
        if args.replay_size is not None:
            params = params.replace(replay_size=args.replay_size)
        if args.replay_initial is not None:
            params = params.replace(replay_initial=args.replay_initial)
        if params.replay_initial > params.replay_size:
            raise UsageError(
                f"--replay-initial {params.replay_initial} is larger than the replay size {params.replay_size}"
            )
        self.device = cli.resolve_device("cuda" if args.cuda else args.device)
        self.saved_knobs = {}  # what checkpoints save: ``Knob.per_device``
        for name in STAGES[self.stage].knobs:  # each knob as the run keeps it on this device
            given = getattr(args, name)
            try:
                setattr(args, name, KNOBS[name].resolve(given, self.device.type))
            except ValueError as e:
                raise UsageError(str(e)) from None
            self.saved_knobs[name] = given if KNOBS[name].per_device else getattr(args, name)
        self.notice = self._emulated_bf16()
        self._check_knobs(params)
        if not cli.env_exists(params.env_name):
            raise UsageError(f"env id {params.env_name!r} does not exist")
        resume.check_env(params.env_name, self.stage)
        self.params = params
        self.start_frame = int(self.ckpt["frame_idx"]) if self.ckpt else 0
        if self.ckpt is not None and args.save_every is None:
            args.save_every = self.ckpt.get("save_every")
        if args.max_frames is not None and args.max_frames <= self.start_frame:
            raise UsageError(f"--max-frames {args.max_frames} is not past the checkpoint's frame {self.start_frame}")
        self.replay = self._check_replay()
        if STAGES[self.stage].wrappers == "vector":  # ale-py's vector env: an int32 seed per game
            cli.check_seed(args.seed, self.start_frame + args.envs - 1, cli.INT32_MAX, "ale-py's vector env")
        if self.ckpt is None:
            cli.check_writable_dir(args.run_dir, "--run-dir", room=len(self.game) + 64)  # and the run's folder
        else:
            folder = os.path.dirname(os.path.abspath(args.resume))
            cli.check_writable_dir(folder, "--resume")
            self.lock = runlock.claim(folder, f"--resume {args.resume}")

    def _emulated_bf16(self) -> str | None:
        """The line a resume prints when it goes on in bf16 from its checkpoint on a device that
        would emulate it (several times slower): a checkpoint saves ``bf16`` where it was given,
        or where a run before ``Knob.per_device`` resolved ``auto`` to it."""
        args = self.args
        if self.ckpt is None or "precision" not in STAGES[self.stage].knobs or "--precision" in self.given:
            return None
        if args.precision != "bf16" or precision.native_bf16(self.device.type):
            return None
        return (
            f"note: the checkpoint's learner is bf16, which {self.device.type} here emulates (several times "
            "slower); --precision auto computes in fp32 where bf16 is not native"
        )

    def _check_replay(self) -> dict | None:
        """With --save-replay, checkpoints hold the replay ring; a checkpoint that holds one
        is resumed with it (and goes on saving it). Returns the saved ring, read and checked."""
        args, ckpt = self.args, self.ckpt
        saved = ckpt.get("replay") if ckpt is not None else None
        args.save_replay = args.save_replay or saved is not None
        if args.save_replay and not args.save_every:
            raise UsageError("--save-replay needs --save-every N (the checkpoints it goes into)")
        if saved is None:
            return None
        return resume.open_ring(args.resume, ckpt, self.stage, self.params, args.envs)

    def _check_knobs(self, params: Hyperparams) -> None:
        """The stage's own knobs against each other and against this machine's memory."""
        steps, envs = self.args.steps, self.args.envs
        batch = params.batch_size * steps
        if batch > params.replay_size:
            raise UsageError(
                f"--steps {steps}: a train batch of {params.batch_size}*{steps} = {batch} transitions is larger "
                f"than the replay size {params.replay_size}"
            )
        if envs > 1 and params.replay_size // envs < 8:
            raise UsageError(f"--envs {envs}: the replay size {params.replay_size} leaves under 8 slots per game")
        memory.check(params.replay_size, envs, STAGES[self.stage].play != "inline")

    # -- start: the run folder, writer, tracker, seeds -------------------------------------
    def start(self) -> None:
        process_settings()
        self._started = time.perf_counter()
        self.commit = cli.git_commit()  # the code this run started with
        if self.ckpt is not None:
            self.folder = os.path.dirname(os.path.abspath(self.args.resume))
            removed = checkpoint.clear_leftovers(self.folder, self.args.resume, self.ckpt)
            if removed:  # their room is the next save's
                say(f"removed what a save cut short left in {self.folder}: {', '.join(removed)}")
        else:
            stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
            base = os.path.join(self.args.run_dir, f"{self.stage}-{self.game}-seed{self.args.seed}-{stamp}")
            self.folder, self.lock = runlock.make_folder(base)
        # A resumed run drops the events logged after its checkpoint; those of the checkpoint's
        # own frame were logged before it was taken.
        self.writer = EventWriter(self.folder, purge_step=self.start_frame + 1 if self.ckpt else None)
        rewards = self.ckpt["rewards"] if self.ckpt else None
        log = (lambda _line: None) if self.args.quiet else (lambda line: print(line, flush=True))
        self.tracker = RewardTracker(self.writer, self.params.stop_reward, rewards=rewards, log=log)
        if self.ckpt is not None:
            self.tracker.best_mean = self.ckpt.get("best_mean")
        for probe in self.probes.values():
            probe.start()
        self.writer.flush()  # an event file that could not be made stops the run here, with its RESULT line
        set_seed(self.args.seed)  # before the nets are built, so that their initial weights repeat

    # -- objects that checkpoints hold ----------------------------------------------------
    @property
    def env_seed(self) -> int:
        """The seed for the env's first reset (shifted on resume so games do not repeat)."""
        return self.args.seed + self.start_frame

    def attach(self, buffer=None, **objects) -> None:
        """Register net, tgt_net and optimizer (every checkpoint holds them) and the replay
        buffer (checkpoints hold it with --save-replay); on resume, load their saved state."""
        self.saveables.update(objects)
        self.buffer = buffer
        if self.ckpt is None:
            return
        converted = checkpoint.restore(self.ckpt, objects, self.tracker, buffer, self.replay, self.stage)
        if self.replay is not None:
            self.replay = None  # the file's mapping goes; the buffer holds the ring
            how = f"with its replay buffer of {len(buffer)} transitions{converted}"
        else:
            how = f"the replay buffer is refilled with {self.params.replay_initial} transitions before training goes on"
        print(f"resuming {self.ckpt['stage']} {self.game} at frame {self.start_frame}: {how}", flush=True)
        if self.changed:
            changes = ", ".join(f"--{k.replace('_', '-')} {old} -> {new}" for k, (old, new) in self.changed.items())
            print(f"resumed with changes from the checkpoint: {changes}", flush=True)
        if self.notice:
            print(self.notice, flush=True)

    def parts(self, **parts):
        """The loop's parts by role (``env``, ``buffer``, ``stager``, ``act``, ``receive``,
        ``learn``, ``pace``), each as the run's probes measure it, in the order given."""
        for probe in self.probes.values():
            parts = {role: probe.wrap(role, part) for role, part in parts.items()}
        return tuple(parts.values())

    def play_side(self) -> probes.PlaySide:
        """What a play process measures with (``PlayArgs.probes``)."""
        return probes.PlaySide([probe.play_side() for probe in self.probes.values()])

    def start_env(self, env):
        """Seed and reset ``env`` for the run's first game, or, resuming a checkpoint that holds
        the game in progress (--save-replay), put it back; returns the current observation."""
        self.env = env
        if self.ckpt is not None and "env" in self.ckpt:
            return game_state.restore_env(env, self.ckpt["env"])
        env.action_space.seed(self.env_seed)
        state, _ = env.reset(seed=self.env_seed)
        return state

    def run_seconds(self) -> float | None:
        """Seconds the run has taken to reach ``frame_idx`` over all its sittings: those its
        checkpoint had taken plus this sitting's (the frames an interrupted sitting played past
        its last checkpoint are played again, and counted once). None when resumed from a
        checkpoint that does not say."""
        before = self.ckpt.get("run_seconds") if self.ckpt is not None else 0.0
        return None if before is None else before + time.perf_counter() - self._started

    def save_checkpoint(self) -> str:
        self.tracker.flush_loss()  # the events up to the checkpoint's frame are all written
        path = checkpoint.write_checkpoint(self)
        self._last_save = self.frame_idx
        return path

    def save_model(self, name: str) -> str:
        return checkpoint.write_model(self, name)

    # -- the loop --------------------------------------------------------------------------
    def frames(self, step: int = 1):
        """Yield the agent-step counter in increments of ``step`` until --max-frames or a solve.

        Code after ``yield`` runs once the loop body of that frame is complete, so the checkpoint
        taken there is consistent. A solve ends the loop after the solving frame's body, the
        run's frame count staying at the solving game's (the body leaves its play with one break)."""
        frame_idx = self.frame_idx
        limit = self.args.max_frames
        every = self.args.progress
        next_report = time.perf_counter() + (every or 0.0)
        while limit is None or frame_idx < limit:
            signals.check()  # a stop whose raise Python swallowed (lib.run.signals)
            frame_idx += step
            for probe in self.probes.values():
                probe.tick(frame_idx)
            yield frame_idx
            if self.solved_flag:
                return
            self.frame_idx = frame_idx
            if every and time.perf_counter() >= next_report:
                next_report += every
                phase = "train" if self.speed.started else "fill"
                fps = self.speed.fps(frame_idx)
                say(f"PROGRESS stage={self.stage} frame={frame_idx} phase={phase} fps={fps:.1f}")
            if self.args.save_every and crossed(self._last_save, frame_idx, self.args.save_every):
                self.save_checkpoint()
            if any([probe.after(frame_idx, step) for probe in self.probes.values()]):
                return  # a probe ends the run as at --max-frames (a layer dead at two checks in a row)

    def game_over(self, reward: float, frame_idx: int, epsilon: float) -> bool:
        """Report a finished game; keep the best model (``lib.run.probes.best_model``); True
        when solved (``model.pt`` is written at the end; games ending after the solve go unreported)."""
        if self.solved_flag:
            return True
        self.frame_idx = frame_idx
        solved = self.tracker.reward(reward, frame_idx, epsilon)
        self.best.game(self.tracker.new_best() and "net" in self.saveables)
        if solved:
            self.solved_flag = True  # ``frames`` ends after this frame; ``close`` writes model.pt
            print(f"Solved in {frame_idx} frames!", flush=True)
        return solved

    # -- the end ---------------------------------------------------------------------------
    def stop_children(self) -> None:
        procs.stop_all(self.children)

    def close(self, interrupted: str | None = None, error: str | None = None) -> tuple[dict, str | None]:
        """End the children, take the last checkpoint (unless the run failed), flush TensorBoard
        and write the summary and the TIME and RESULT lines. Returns (summary, the first write failure)."""
        times = self.probes["time_by_part"].figures(self.frame_idx)  # before the play process stops
        self.stop_children()
        failed = None
        try:
            self.best.write()  # the newest best is never lost at the end
            if self.solved_flag and "net" in self.saveables:
                self.save_model("model.pt")  # the net the run ends with, as its checkpoint holds it
        except (WriteError, DeviceError) as e:
            failed = self._failed(e)
        if self.args.save_every and not (error or self.fault) and self.saveables and self.frame_idx > self._last_save:
            try:
                self.save_checkpoint()  # the end of a run, or the last complete frame before a signal
            except (WriteError, DeviceError) as e:
                failed = failed or self._failed(e)
        try:
            self.tracker.flush_loss()  # a failed device loses its last loss point, not the summary
        except (WriteError, DeviceError) as e:
            failed = failed or self._failed(e)
        try:
            for probe in self.probes.values():
                probe.end(self.frame_idx)
            self.writer.close()
        except WriteError as e:
            failed = failed or str(e)
        error = error or failed
        summary = run_summary.summary(self, interrupted, error, times)
        written = self._write_summary(summary)
        failed = failed or written
        for line in run_summary.exit_lines(self, summary, interrupted, bool(error or failed)):
            say(line)
        if written is None and self.stdout is not None and self.stdout.dropped > summary["stdout_dropped"]:
            summary["stdout_dropped"] = self.stdout.dropped  # the exit lines too: the summary says so
            failed = failed or self._write_summary(summary)
        return summary, failed

    def _failed(self, error: RunError) -> str:
        """What ``close`` says of a failure; a device's is kept as ``fault`` (the exit code is 1, not 74)."""
        if isinstance(error, DeviceError):
            self.fault = self.fault or str(error)
        return str(error)

    def _write_summary(self, summary: dict) -> str | None:
        """Write summary.json; the failure, if it could not be written."""
        try:
            data = json.dumps(summary, indent=2).encode()
            atomic_write(os.path.join(self.folder, "summary.json"), lambda f: f.write(data))
        except WriteError as e:
            return str(e)
        return None


@dataclasses.dataclass
class Outcome:
    """What ``main`` returns: the exit code, the summary written (None for bad input), the run."""

    code: int
    summary: dict | None = None
    run: Run | None = None


def main(stage: str, description: str | None, train, argv=None) -> Outcome:
    """Parse (the stage's command line, ``stage_args.make_parser``; ``description``: the script's
    docstring), validate, run ``train(run)`` and close the run; every outcome becomes an exit code.

    Signal handlers and torch's thread count are restored on return, so that stages can run
    one after another in one process."""
    parser = make_parser(stage, description)
    try:
        args = parser.parse_args(argv)
        run = Run(stage, args, argv)
    except UsageError as e:
        return Outcome(cli.usage_exit(parser.prog, e))
    threads = torch.get_num_threads()
    old_thread_hook = threading.excepthook
    threading.excepthook = EventWriter.quiet_writer_threads(old_thread_hook)
    restore_handlers = signals.stop_on_signals()
    stdout = sys.stdout
    sys.stdout = run.stdout = cli.DroppingStdout(stdout)  # a reader gone, or not reading, drops lines, not the run
    code, interrupted, error = 0, None, None
    try:
        try:
            run.start()
            train(run)
            signals.check()
        except (KeyboardInterrupt, Terminated) as e:
            code, interrupted = signals.stopped_by(e)
        except RunError as e:
            code, error = (EXIT_WRITE if isinstance(e, WriteError) else EXIT_FAILED), str(e)
            print(f"{parser.prog}: error: {e}", file=sys.stderr, flush=True)
        except Exception as e:
            code, error = EXIT_FAILED, f"{type(e).__name__}: {e}"
            traceback.print_exc()
        signals.ignore_stops()  # further signals must not cut the wrap-up short
        if run.tracker is None:  # start() could not create the folder or writer: nothing to close
            run.stop_children()
            return Outcome(code, None, run)
        summary, failed = run.close(interrupted, error)
        if failed and error is None:  # one line for the first failure; what follows from it is not news
            print(f"{parser.prog}: error: {failed}", file=sys.stderr, flush=True)
        if failed and (code == 0 or interrupted):
            code = EXIT_FAILED if run.fault else EXIT_WRITE
        sys.stdout.flush()
        return Outcome(code, summary, run)
    finally:
        if run.lock is not None:
            run.lock.release()
        sys.stdout = stdout
        restore_handlers()
        threading.excepthook = old_thread_hook
        torch.set_num_threads(threads)


def exit_with(outcome: Outcome) -> None:
    """A script's last word: its exit code (a Ctrl-C now would end the process by the signal)."""
    signals.ignore_stops()
    sys.exit(outcome.code)
