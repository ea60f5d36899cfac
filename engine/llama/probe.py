"""Load a model file once in a child process before loading it in this one.

llama.cpp aborts the whole process (GGML_ASSERT, SIGABRT) or reads out of bounds on some damage
that no header check foresees, and the kernel kills a process that runs out of memory. The first
time a file is opened, ``ensure_loadable`` loads it in a child with the same context size and
threads, tokenizes and decodes a few tokens, and turns the child's death into a ``ModelFileError``
of one line. A file that loaded is remembered (absolute path, size, modification time and the
llama.cpp version) in the user cache dir, so later opens skip the probe.

The child is ``python -m engine.decoding.load_check PATH --ctx N --threads N``; in a frozen app
``sys.executable`` is the app itself, which runs it when given ``--engine-probe`` first
(packaging/launch.py). ``LOOKAHEAD_NO_PROBE=1`` turns the probe off.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engine.files import cache_root, file_identity, write_json_atomic
from engine.llama.models import GgufSummary, check_gguf
from engine.llama.problems import (
    KIND_CRASHED,
    KIND_DAMAGED,
    KIND_MEMORY,
    KIND_NO_BACKEND,
    KIND_OTHER,
    KIND_TOO_SLOW,
    KIND_UNREADABLE,
    NO_BACKEND_PHRASE,
    ModelFileError,
    problem_kind,
)
from engine.llama.ram import check_context_fits

NO_PROBE_ENV = "LOOKAHEAD_NO_PROBE"
FROZEN_FLAG = "--engine-probe"
# The child's entry point: the engine's own load (a layer above this one, so named, not imported)
CHILD_MODULE = "engine.decoding.load_check"
CACHE_NAME = "loadable-models.json"
CACHE_VERSION = 1
CACHE_MAX_ENTRIES = 200  # newest kept; an evicted file is only probed again

# The child's exit codes besides 0 (loaded) and a signal.
EXIT_REFUSED = 65  # llama.cpp refused the file with an error (no crash); not 3, which abort() gives on Windows
EXIT_FAILED = 4  # anything else went wrong in the child
EXIT_NO_BACKEND = 66  # ggml found no backend in the app's own llama.cpp folder: the app is at fault, not the file



class ProbeCancelled(Exception):
    """``cancel`` was set while the child ran; the child was stopped and nothing is known about the file."""


@dataclass(frozen=True)
class ProbeResult:
    """What ``ensure_loadable`` did: probed (a child loaded the file now) or not, and how long it took.

    ``summary`` is the header check it made, for ``Engine(summary=...)`` (so the file is read once).
    """

    probed: bool
    seconds: float
    summary: GgufSummary | None = field(default=None, compare=False)


def probe_timeout(size_bytes: int) -> float:
    """Seconds a child may take: a minute, plus a second per 20 MB (a slow disk read cold)."""
    return 60.0 + size_bytes / 20e6


def cache_path() -> Path:
    """The JSON file of model files known to load, beside the cost-curve cache."""
    return cache_root() / CACHE_NAME


def probe_key(path: str | os.PathLike[str]) -> str:
    """What a verdict holds for: one file's content (``file_identity``) and the llama.cpp build that loads it
    (``backend.build_id``: a rebuilt llama.cpp of the same version may load a file differently)."""
    from engine.llama.backend import build_id  # local: importing the probe does not load llama.cpp

    return f"{file_identity(Path(path).resolve())}|{build_id()}"


def _load_cache(path: Path) -> dict[str, dict]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict) or data.get("version") != CACHE_VERSION or not isinstance(data.get("loadable"), dict):
        return {}
    return data["loadable"]


def _remember(path: Path, key: str, seconds: float) -> None:
    """Add a file that loaded; best effort (an unwritable cache only means probing again)."""
    entries = _load_cache(path)
    entries.pop(key, None)
    entries[key] = {"seconds": round(seconds, 3), "when": time.time()}
    if len(entries) > CACHE_MAX_ENTRIES:
        entries = dict(list(entries.items())[-CACHE_MAX_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, {"version": CACHE_VERSION, "loadable": entries}, indent=1)
    except OSError:
        pass


def child_command(path: str | os.PathLike[str], n_ctx: int, n_threads: int) -> list[str]:
    """The command that probes ``path``: this interpreter with ``-m CHILD_MODULE``, or a frozen app's own flag."""
    args = [str(path), "--ctx", str(n_ctx), "--threads", str(n_threads)]
    if getattr(sys, "frozen", False):
        return [sys.executable, FROZEN_FLAG, *args]
    return [sys.executable, "-m", CHILD_MODULE, *args]


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env[NO_PROBE_ENV] = "1"  # the child never probes itself
    env["GGML_NO_BACKTRACE"] = "1"  # an abort prints its one line, not a gdb backtrace (slow, and noise)
    env.pop("LOOKAHEAD_LLAMA_LOG", None)  # the child reports llama.cpp's warnings and errors itself
    root = str(Path(__file__).resolve().parents[2])  # where ``engine`` is importable from
    env["PYTHONPATH"] = os.pathsep.join(x for x in (root, env.get("PYTHONPATH", "")) if x)
    return env


_ASSERT = re.compile(r"(GGML_ASSERT\(.*\) failed)")
_SOURCE_PREFIX = re.compile(r"^\S*?([\w.-]+\.(?:c|cc|cpp|h)):\d+: ")
_FUNCTION_PREFIX = re.compile(r"^(?:[a-z_][a-z0-9_]*: )+")  # "llama_model_load: " and the like


def _useful_line(stderr: str) -> str:
    """The child's line that says most about its end: an assert, an error, or "" (a plain warning would mislead)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        m = _ASSERT.search(ln)
        if m:
            return m.group(1)
    for ln in reversed(lines):
        if ln.startswith("error: "):
            return ln.removeprefix("error: ")
    for i, ln in enumerate(lines):  # an uncaught C++ exception: "terminate called ...", then "what(): ..."
        if ln.startswith("what():") and i > 0 and lines[i - 1].startswith("terminate called"):
            return f"{lines[i - 1]}: {ln.removeprefix('what():').strip()}"
    for ln in reversed(lines):
        low = ln.lower()
        if "error" in low or "failed" in low or "fatal" in low or "terminate" in low:
            return _SOURCE_PREFIX.sub(r"\1: ", ln)
    return ""


def _one_line(text: str, limit: int = 240) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def crash_name(rc: int, windows: bool = os.name == "nt") -> str | None:
    """How the child crashed, from its exit code; None if it exited.

    POSIX gives the signal as a negative code. Windows gives an exception's NTSTATUS as an unsigned code
    (0xC0000005 for an access violation), and 3 for abort(), which is what a failed GGML_ASSERT calls.
    """
    if rc < 0:
        return _signal_name(-rc)
    if windows and rc >= 0xC0000000:
        return f"exception 0x{rc:08X}"
    if windows and rc == 3:
        return "abort"
    return None


def run_probe(
    path: str | os.PathLike[str],
    n_ctx: int,
    n_threads: int,
    command: Sequence[str] | None = None,
    timeout: float | None = None,
    cancel: threading.Event | None = None,
) -> float:
    """Run the child once; return its seconds, or raise ModelFileError saying how it ended.

    Setting ``cancel`` stops the child within a fifth of a second and raises ``ProbeCancelled``.
    """
    p = Path(path)
    cmd = list(command) if command is not None else child_command(p, n_ctx, n_threads)
    limit = timeout if timeout is not None else probe_timeout(p.stat().st_size)
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                env=_child_env(), start_new_session=_has_process_groups())
    except OSError as exc:
        raise ModelFileError(f"could not start a process to test-load the model ({exc.strerror or exc}): {p}",
                             kind=KIND_OTHER) from None
    err = _wait_for_child(proc, p, t0 + limit, limit, cancel)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise _child_failure(proc.returncode, err.decode("utf-8", errors="replace"), p)
    return seconds


def _wait_for_child(
    proc: subprocess.Popen, p: Path, deadline: float, limit: float, cancel: threading.Event | None
) -> bytes:
    """The child's stderr once it has ended; stopped (and never left behind) past ``deadline`` or on a cancel."""
    try:
        while True:
            try:  # in short waits, to notice ``cancel``; a retried communicate() loses no output
                _, err = proc.communicate(timeout=max(0.0, min(0.2, deadline - time.perf_counter())))
                return err
            except subprocess.TimeoutExpired:
                if cancel is not None and cancel.is_set():
                    raise ProbeCancelled(f"the test load of {p} was cancelled") from None
                if time.perf_counter() >= deadline:
                    raise ModelFileError(
                        f"loading the model took longer than {limit:.0f} s in a test process, which was stopped; "
                        f"the file may be damaged: {p}", kind=KIND_TOO_SLOW,
                    ) from None
    except BaseException:  # timeout, cancel, Ctrl+C or a closing app: leave no child behind
        _stop_child(proc)
        proc.communicate()
        raise


def _child_failure(rc: int, stderr: str, p: Path) -> ModelFileError:
    """What a child that ended with ``rc`` (not 0) says of the file, from how it ended and its stderr."""
    detail = _FUNCTION_PREFIX.sub("", _one_line(_useful_line(stderr)).replace(str(p), p.name))
    sig = crash_name(rc)
    if sig is not None:
        if sig == "SIGKILL":
            return ModelFileError(
                f"the test process loading the model was killed (SIGKILL), most likely for lack of memory; "
                f"try a smaller context or close other programs: {p}", kind=KIND_MEMORY,
            )
        said = f": {detail}" if detail else ""
        return ModelFileError(f"llama.cpp crashed ({sig}) loading the model{said} — the file is damaged: {p}",
                              kind=KIND_CRASHED)
    if rc == EXIT_NO_BACKEND:
        return ModelFileError(f"test-loading {p}: {detail or NO_BACKEND_PHRASE}", kind=KIND_NO_BACKEND)
    # llama.cpp's own reason may name the kind (an unknown architecture, an allocation that failed)
    if rc == EXIT_REFUSED:
        return ModelFileError(f"llama.cpp cannot load the model: {detail or 'no reason given'}: {p}",
                              kind=problem_kind(detail, default=KIND_DAMAGED))
    return ModelFileError(f"test-loading the model failed (exit code {rc}): {detail or 'no reason given'}: {p}",
                          kind=problem_kind(detail))


def _has_process_groups() -> bool:
    """Whether the child can lead a process group that is killed as one (POSIX); Windows has no ``os.killpg``."""
    return hasattr(os, "killpg")


def _stop_child(proc: subprocess.Popen) -> None:
    """Kill the child now: on POSIX its whole process group, on Windows the child itself (TerminateProcess).

    The child runs llama.cpp in its own process and starts none, so on Windows nothing is left behind.
    """
    if _has_process_groups():
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started
            return
        except (ProcessLookupError, PermissionError):
            pass
    proc.kill()


def ensure_loadable(
    path: str | os.PathLike[str],
    n_ctx: int,
    n_threads: int,
    command: Sequence[str] | None = None,
    timeout: float | None = None,
    cache: Path | None = None,
    cancel: threading.Event | None = None,
) -> ProbeResult:
    """Make sure loading ``path`` cannot kill this process; probe it in a child the first time.

    Runs the header checks first (their messages are the precise ones), then, unless the file
    loaded before or ``LOOKAHEAD_NO_PROBE=1``, the child. Raises ``ModelFileError`` (or the
    header checks' errors) with one line; returns whether a child ran and its seconds.
    Setting ``cancel`` (from another thread) stops the child and raises ``ProbeCancelled``.
    ``command``, ``timeout`` and ``cache`` replace the child's command line, its time limit and
    the cache file (tests).
    """
    summary = check_gguf(path)
    check_context_fits(summary, n_ctx)
    if os.environ.get(NO_PROBE_ENV) == "1":
        return ProbeResult(False, 0.0, summary)
    store = cache if cache is not None else cache_path()
    try:
        key = probe_key(path)
    except OSError as exc:
        raise ModelFileError(f"cannot access model file ({exc.strerror}): {path}",
                             f"This file cannot be opened ({exc.strerror}).", KIND_UNREADABLE) from None
    if key in _load_cache(store):
        return ProbeResult(False, 0.0, summary)
    seconds = run_probe(path, n_ctx, n_threads, command=command, timeout=timeout, cancel=cancel)
    _remember(store, key, seconds)
    return ProbeResult(True, seconds, summary)


# --- the child ------------------------------------------------------------------------------


def run_child(argv: list[str] | None, load_and_decode: Callable[[str, int, int], None]) -> int:
    """The child's work: ``load_and_decode(PATH, N, N)`` for ``PATH --ctx N --threads N``; exit 0 if the model
    loaded and decoded, else one line on stderr and an exit code the parent reads. ``load_and_decode`` is the
    engine's own (engine/decoding/load_check.py): the child opens the context the engine will."""
    parser = argparse.ArgumentParser(prog=f"python -m {CHILD_MODULE}", description="test-load a GGUF model")
    parser.add_argument("path")
    parser.add_argument("--ctx", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True)
    args = parser.parse_args(argv)
    from engine.llama.backend import (
        BackendUnavailableError,
        NativeError,
        last_log_error,
        llama_lib_dir,
        no_backend_text,
        report_log_to_stderr,
    )

    try:
        report_log_to_stderr()
        load_and_decode(args.path, args.ctx, args.threads)
    except BackendUnavailableError as exc:
        print(f"error: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_NO_BACKEND
    except NativeError as exc:  # llama.cpp's own reason is the useful part
        reason = last_log_error() or str(exc)
        if problem_kind(reason) == KIND_NO_BACKEND:  # registered, yet llama.cpp found none when loading
            print(f"error: {_one_line(f'{no_backend_text(llama_lib_dir())}: {reason}')}", file=sys.stderr)
            return EXIT_NO_BACKEND
        print(f"error: {_one_line(reason)}", file=sys.stderr)
        return EXIT_REFUSED
    except Exception as exc:  # reported as one line; the parent says the test load failed
        print(f"error: {type(exc).__name__}: {_one_line(str(exc))}", file=sys.stderr)
        return EXIT_FAILED
    return 0

