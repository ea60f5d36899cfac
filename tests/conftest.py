"""Shared fixtures: the bundled model, loaded once per test session."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from engine import RunStats

# Tests never touch the real home: the app's data and the engine's cost-curve
# cache go to a temp dir (tests that need their own set it per test).
os.environ.setdefault("LOOKAHEAD_CHAT_HOME", tempfile.mkdtemp(prefix="lookahead-chat-tests-"))
if "QT_QPA_PLATFORM" not in os.environ:
    # Offscreen Qt's screen is 800×600 unless told otherwise, and the app fits its first window to the screen:
    # tests get a desktop's (tests/app/test_first_window.py opens windows on laptop screens in their own process).
    _screen = Path(os.environ["LOOKAHEAD_CHAT_HOME"]) / "offscreen-screen.json"
    _screen.parent.mkdir(parents=True, exist_ok=True)
    _screen.write_text(json.dumps({"screens": [{"name": "desktop", "x": 0, "y": 0, "width": 1920, "height": 1200,
                                                "logicalDpi": 96, "logicalBaseDpi": 96, "dpr": 1}]}))
    os.environ["QT_QPA_PLATFORM"] = f"offscreen:configfile={_screen}"

# The app's fixtures (windows, dialogs, data dirs, the engine-thread check), for every test module.
pytest_plugins = ["tests.helpers.app_fixtures"]


@pytest.fixture(scope="session")
def model_path():
    from engine import ModelFileError, default_model_path

    try:
        return default_model_path()
    except ModelFileError as exc:  # the README's test command installs it; say so loudly
        pytest.fail(f"bundled model missing: {exc}")


@pytest.fixture(scope="session")
def engine(model_path):
    from engine import Engine

    eng = Engine(model_path, n_ctx=4096, n_threads=2)
    yield eng
    eng.close()


@pytest.fixture
def fresh_engine(engine):
    """The shared engine with an empty cache."""
    engine.reset()
    return engine


class PlainReference:
    """Plain greedy decodings of the shared engine, each prompt decoded once per test session.

    Many tests compare lookahead's text with plain decoding's on the same prompts: the plain run is the same
    whichever test asks (greedy, one token a step), so it is decoded once, at the longest length asked for;
    a shorter greedy run is its prefix.
    """

    def __init__(self, engine) -> None:
        self.engine = engine
        self._runs: dict[tuple[int, ...], tuple[int, RunStats]] = {}  # prompt -> (max_tokens, RunStats)

    def run(self, prompt: Sequence[int], max_tokens: int) -> RunStats:
        """The plain run of ``prompt`` with exactly this ``max_tokens`` (its RunStats: tokens, text, stop)."""
        known = self._runs.get(tuple(prompt))
        if known is not None and known[0] == max_tokens:
            return known[1]
        return self._decode(prompt, max_tokens)

    def tokens(self, prompt: Sequence[int], max_tokens: int) -> list[int]:
        """The first ``max_tokens`` tokens plain decoding gives for ``prompt`` (fewer if it ended)."""
        known = self._runs.get(tuple(prompt))
        if known is not None and (known[0] >= max_tokens or known[1].stop_reason != "max_tokens"):
            return list(known[1].token_ids[:max_tokens])
        return list(self._decode(prompt, max_tokens).token_ids)

    def _decode(self, prompt: Sequence[int], max_tokens: int) -> RunStats:
        from engine import GenerationControls, RunStats, StopConfig

        self.engine.reset()
        stats = RunStats.of(self.engine.generate(list(prompt), GenerationControls(lookahead=None),
                                                 stop=StopConfig(max_tokens=max_tokens)))
        known = self._runs.get(tuple(prompt))
        if known is None or known[0] < max_tokens:
            self._runs[tuple(prompt)] = (max_tokens, stats)
        return stats


@pytest.fixture(scope="session")
def plain_reference(engine) -> PlainReference:
    """Plain decoding's runs on the shared engine, shared by every test that compares with them."""
    return PlainReference(engine)
