"""Shared fixtures: the bundled model, loaded once per test session."""

from __future__ import annotations

import os
import tempfile

import pytest

# Tests never touch the real home: the app's data and the engine's cost-curve
# cache go to a temp dir (tests that need their own set it per test).
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
os.environ.setdefault("LOOKAHEAD_CHAT_HOME", tempfile.mkdtemp(prefix="lookahead-chat-tests-"))

# The app's fixtures (windows, dialogs, data dirs, the engine-thread check), for every test module.
pytest_plugins = ["tests.app_fixtures"]


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
