"""The one way the app and the command line open a model: check the file, test-load it, then open the engine on
it. The test load and the engine are fakes here; tests/engine/llama/test_damaged_models.py runs the real ones."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from engine.decoding.opening import ModelOpener
from engine.decoding.runtime import default_threads
from engine.llama.probe import ProbeResult
from engine.llama.problems import ModelFileError

BUNDLED = Path("/models/bundled.gguf")


class Recorder:
    """Fakes of the test load and the engine that note, in order, what they were asked."""

    def __init__(self, fail_check: bool = False) -> None:
        self.calls: list[tuple[str, Path, dict]] = []
        self.fail_check = fail_check
        self.made: list[Any] = []
        self.summary: Any = SimpleNamespace(name="checked")  # stands for the header check's GgufSummary

    def check(self, path: Path, **kwargs) -> ProbeResult:
        self.calls.append(("check", path, kwargs))
        if self.fail_check:
            raise ModelFileError(f"llama.cpp crashed (SIGABRT) loading the model — the file is damaged: {path}")
        return ProbeResult(probed=True, seconds=0.25, summary=self.summary)

    def engine(self, path: Path, **kwargs) -> Any:
        self.calls.append(("engine", path, kwargs))
        self.made.append(SimpleNamespace(path=path))
        return self.made[-1]

    def opener(self) -> ModelOpener:
        return ModelOpener(engine_factory=self.engine, check_loadable=self.check, default_model=lambda: BUNDLED)


def test_a_model_is_test_loaded_before_the_engine_opens_it_and_the_engine_reuses_the_check():
    seen = Recorder()
    progress, cancel = (lambda _f: True), threading.Event()

    opened = seen.opener().open("/models/other.gguf", 2048, 3, progress=progress, cancel=cancel)

    path = Path("/models/other.gguf")
    assert [(what, where) for what, where, _ in seen.calls] == [("check", path), ("engine", path)]
    assert seen.calls[0][2] == {"n_ctx": 2048, "n_threads": 3, "cancel": cancel}
    assert seen.calls[1][2] == {"n_ctx": 2048, "n_threads": 3, "progress": progress, "summary": seen.summary}
    assert opened.path == path and opened.engine is seen.made[0]
    assert opened.probe.probed and opened.probe.seconds == 0.25


@pytest.mark.parametrize("path", [None, ""], ids=["none", "empty"])
def test_no_file_named_opens_the_bundled_model(path):
    seen = Recorder()
    assert seen.opener().open(path, 4096).path == BUNDLED
    assert {where for _, where, _ in seen.calls} == {BUNDLED}


@pytest.mark.parametrize("threads", [None, 0], ids=["none", "zero"])
def test_threads_left_to_the_engine_are_picked_by_it_and_the_test_load_runs_with_as_many(threads):
    seen = Recorder()
    seen.opener().open("/models/m.gguf", 4096, threads)
    assert seen.calls[0][2]["n_threads"] == default_threads()
    assert seen.calls[1][2]["n_threads"] is None  # the engine picks, and gives one up on a busy PC


def test_a_file_that_fails_its_test_load_is_never_opened_in_this_process():
    seen = Recorder(fail_check=True)
    with pytest.raises(ModelFileError, match="damaged"):
        seen.opener().open("/models/broken.gguf", 4096)
    assert [what for what, _, _ in seen.calls] == ["check"]
