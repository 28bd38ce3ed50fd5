"""lib.run.runlock: a run folder held by one process at a time, and new run folders never shared."""

import os

import pytest

from lib.run import runlock
from lib.run.cli import UsageError


def test_a_held_folder_is_refused_naming_its_holder_until_released(tmp_path):
    lock = runlock.claim(str(tmp_path), "first")
    with pytest.raises(UsageError, match=f"^--resume x: the run folder {tmp_path} is in use by process {os.getpid()} "):
        runlock.claim(str(tmp_path), "--resume x")
    assert list(tmp_path.iterdir()) == []  # nothing is written into the folder for the lock
    lock.release()
    lock.release()  # a second release is nothing
    runlock.claim(str(tmp_path), "again").release()


def test_each_new_folder_is_made_not_reused(tmp_path):
    base = str(tmp_path / "runs" / "01-pong-seed0-20260102-030405")
    made = [runlock.make_folder(base) for _ in range(3)]
    assert [folder for folder, _ in made] == [base, base + "-2", base + "-3"]
    for folder, lock in made:  # each held by its maker
        with pytest.raises(UsageError, match="is in use by process"):
            runlock.claim(folder, "other")
        lock.release()
