"""A test load that is cancelled or runs out of time stops its child on every OS.

POSIX stops the child's whole process group (``os.killpg``); Windows has no ``os.killpg``, so there
the child itself is stopped. Both ways run here on this machine: "windows" removes ``os.killpg`` as
Windows lacks it. The child is a Python process that only sleeps; each test checks that it is gone
(killed and reaped), not only that the probe returned.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine import ModelFileError
from engine.llama import probe

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


@pytest.fixture(params=["posix", "windows"])
def started(request, monkeypatch) -> Iterator[list[subprocess.Popen]]:
    """The processes the probe starts in this test, on the OS named by the parameter; any left running is killed."""
    if request.param == "windows":
        monkeypatch.delattr(os, "killpg")
    procs: list[subprocess.Popen] = []
    real_popen = subprocess.Popen

    def recording_popen(*args, **kwargs) -> subprocess.Popen:
        proc = real_popen(*args, **kwargs)
        procs.append(proc)
        return proc

    monkeypatch.setattr(probe.subprocess, "Popen", recording_popen)
    yield procs
    for proc in procs:  # a failing test leaves no sleeper behind
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture
def model_file(tmp_path) -> Path:
    """Any file: the injected child never reads it (the probe only takes its size for the time limit)."""
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF")
    return path


def assert_gone(procs: list[subprocess.Popen]) -> None:
    assert len(procs) == 1
    assert procs[0].returncode is not None, "the child is still running"
    with pytest.raises(ProcessLookupError):
        os.kill(procs[0].pid, 0)  # reaped, not left as a zombie


@pytest.mark.timing
def test_a_test_load_past_its_time_limit_stops_its_child_with_or_without_process_groups(started, model_file):
    t0 = time.perf_counter()
    with pytest.raises(ModelFileError, match="took longer than 1 s in a test process, which was stopped"):
        probe.run_probe(model_file, n_ctx=256, n_threads=1, command=SLEEPER, timeout=1.0)
    assert time.perf_counter() - t0 < 10
    assert_gone(started)


@pytest.mark.timing
def test_a_cancelled_test_load_stops_its_child_with_or_without_process_groups(started, model_file):
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    t0 = time.perf_counter()
    with pytest.raises(probe.ProbeCancelled):
        probe.run_probe(model_file, n_ctx=256, n_threads=1, command=SLEEPER, cancel=cancel)
    assert time.perf_counter() - t0 < 10
    assert_gone(started)


@pytest.mark.parametrize(("rc", "windows", "crash"), [
    (-11, False, "SIGSEGV"), (-9, False, "SIGKILL"), (0xC0000005, True, "exception 0xC0000005"),
    (3, True, "abort"), (3, False, None), (probe.EXIT_REFUSED, True, None), (probe.EXIT_REFUSED, False, None),
    (1, True, None), (0xC0000005, False, None),
])
def test_a_crash_is_told_from_an_exit_on_each_os(rc, windows, crash):
    assert probe.crash_name(rc, windows=windows) == crash
