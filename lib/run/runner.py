"""A stage's run: all a numbered script knows of the harness, and ``main``, its entry point.

A script is ``train(run)``, its loop, and ``main(argv)``: ``runner.main(STAGE, __doc__, train, argv)``.
In ``train`` it reads ``run.params``, ``run.device`` and ``run.args`` (the settings, decided once
and read-only: ``lib.run.settings``) and calls:

- ``run.attach(net=, tgt_net=, optimizer=, buffer=)``: what checkpoints hold (loaded on a resume);
- ``run.parts(env=, act=, buffer=, receive=, learn=, ...)``: its parts as the probes measure them;
- ``run.start_env(env)``: the first game's observation (on a resume, the game in progress);
- ``for frame_idx in run.frames(step)``: the agent steps; PROGRESS, checkpoints and probes between;
- ``run.game_over(score, frame_idx, epsilon)``: a finished game (None: none); a solve ends the run;
- ``run.speed.start(frame_idx)`` once training starts, ``run.tracker.loss(loss_v, frame_idx)``;
- with a play process (``lib.parallel``): ``PlayArgs.of(run, ...)`` and ``start_player(run, ...)``.

``main`` checks everything before anything is created: bad input is one line, exit 2. Once started,
Ctrl-C (130), SIGTERM (143) and SIGHUP (129) stop the run cleanly (``lib.run.signals``): children
ended, TensorBoard flushed, RESULT and summary.json written, marked interrupted. A file that cannot
be written stops it in one line, exit 74, the last good checkpoint kept; a device failure at the
end, exit 1 (``lib.run.summary.close``). ``Run`` never ends the process: stages run in-process too.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import sys
import time
import traceback

from lib.run import checkpoint, cli, game_state, lifecycle, probes, procs, resume, runlock, signals
from lib.run import summary as run_summary
from lib.run.cli import EXIT_FAILED, EXIT_WRITE, RunError, Terminated, UsageError, WriteError, say
from lib.run.events import EventWriter
from lib.run.probes.best_model import BestModel
from lib.run.probes.trackers import RewardTracker, SpeedMeter
from lib.run.runtime import process_settings, set_seed
from lib.run.settings import settle
from lib.run.stage_args import make_parser
from lib.run.stages import STAGES
from lib.schedules import crossed


class Solved(Exception):
    """Raised by ``Run.game_over`` at the game that solves: the loop ends there (``main`` takes
    it as the run's end, not as an error)."""


class Run:
    """One training run (the module's docstring lists what a script calls): ``Run(stage, args,
    given)`` only checks (UsageError); ``start()`` creates; ``close()`` ends it."""

    def __init__(self, stage: str, args, given: set[str] = frozenset()):
        self.settings = s = settle(stage, args, given)  # checked and decided once (``lib.run.settings``)
        self.stage, self.args, self.given, self.game, self.params, self.device = (
            stage,
            s.args,
            s.given,
            s.game,
            s.params,
            s.device,
        )
        self.ckpt, self.changed, self.saved_knobs, self.notice = s.ckpt, s.changed, s.saved_knobs, s.notice
        self.start_frame, self.replay = s.start_frame, s.replay
        self.resumes = list(self.ckpt.get("resumes", [])) if self.ckpt else []  # this one's added on restore
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
        self.stdout = None  # what main makes sys.stdout (``lifecycle.DroppingStdout``): it counts the lines dropped
        self.fault = None  # a device failure the run's end met (``cli.DeviceError``)
        self.lock = None  # the run folder's (``lib.run.runlock``), held from here (a resume) or start to the end
        if self.ckpt is not None:
            self.lock = runlock.claim(os.path.dirname(os.path.abspath(args.resume)), f"--resume {args.resume}")
        self.frame_idx = self.start_frame
        self._last_save = self.start_frame
        self.best = BestModel(self.save_model)  # best.pt
        self.probes = probes.attach(self, STAGES[stage].probes)  # what the run measures (lib.run.probes)
        self.speed = SpeedMeter(on_start=self.probes["time_by_part"].clocks.mark)

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
        self.resumes = resume.record(self.folder, self.ckpt, self.changed, ring=self.replay is not None)
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
        taken there is consistent. A solve ends the loop inside the solving frame's body
        (``game_over`` raises ``Solved``), the run's frame count staying at the solving game's."""
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

    def game_over(self, reward: float | None, frame_idx: int, epsilon: float) -> None:
        """Report a finished game's score (None: the step finished none); keep the best model (``lib.run.probes.best_model``). The game
        that solves ends the run there, in every stage the same way: ``Solved`` leaves the loop
        at once (no train step follows the solving game), ``main`` takes it as the run's end, and
        ``close`` writes model.pt of the solving frame."""
        if reward is None:
            return
        self.frame_idx = frame_idx
        solved = self.tracker.reward(reward, frame_idx, epsilon)
        self.best.game(self.tracker.new_best() and "net" in self.saveables)
        if solved:
            self.solved_flag = True
            print(f"Solved in {frame_idx} frames!", flush=True)
            raise Solved(frame_idx)

    # -- the end ---------------------------------------------------------------------------
    def stop_children(self) -> None:
        procs.stop_all(self.children)

    def close(self, interrupted: str | None = None, error: str | None = None) -> tuple[dict, str | None]:
        """End the children, take the last checkpoint (unless the run failed), flush TensorBoard
        and write the summary and the TIME and RESULT lines (``lib.run.summary.close``). Returns
        (summary, the first write failure)."""
        return run_summary.close(self, interrupted, error)


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
        args, given = parser.parse_given(argv)
        run = Run(stage, args, given)
    except UsageError as e:
        return Outcome(cli.usage_exit(parser.prog, e))
    with lifecycle.run_process() as run.stdout:
        try:
            return _run(run, parser.prog, train)
        finally:
            if run.lock is not None:
                run.lock.release()


def _run(run: Run, prog: str, train) -> Outcome:
    """Start the run, run ``train(run)`` and close the run; every outcome an exit code."""
    code, interrupted, error = 0, None, None
    try:
        run.start()
        try:
            train(run)
        except Solved:
            pass  # the run's end, at the solving game (``Run.game_over``)
        signals.check()
    except (KeyboardInterrupt, Terminated) as e:
        code, interrupted = signals.stopped_by(e)
    except RunError as e:
        code, error = (EXIT_WRITE if isinstance(e, WriteError) else EXIT_FAILED), str(e)
        print(f"{prog}: error: {e}", file=sys.stderr, flush=True)
    except Exception as e:
        code, error = EXIT_FAILED, f"{type(e).__name__}: {e}"
        traceback.print_exc()
    signals.ignore_stops()  # further signals must not cut the wrap-up short
    if run.tracker is None:  # start() could not create the folder or writer: nothing to close
        run.stop_children()
        return Outcome(code, None, run)
    summary, failed = run.close(interrupted, error)
    if failed and error is None:  # one line for the first failure; what follows from it is not news
        print(f"{prog}: error: {failed}", file=sys.stderr, flush=True)
    if failed and (code == 0 or interrupted):
        code = EXIT_FAILED if run.fault else EXIT_WRITE
    sys.stdout.flush()
    return Outcome(code, summary, run)


def exit_with(outcome: Outcome) -> None:
    """A script's last word: its exit code (a Ctrl-C now would end the process by the signal)."""
    signals.ignore_stops()
    sys.exit(outcome.code)
