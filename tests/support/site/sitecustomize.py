"""Loaded at start-up by every Python process of a test run whose PYTHONPATH names this
folder, spawned play processes included: registers the synthetic env and its "synthetic"
hyperparameter set, so that the real stage scripts can train on it unchanged."""

from lib.params import GAMES
from tests.support.sidetarget import PARAMS

GAMES["synthetic"] = PARAMS
