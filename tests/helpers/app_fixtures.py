"""Shared fixtures of the app's tests (a pytest plugin: tests/conftest.py lists it in ``pytest_plugins``).

Every test gets its own data dir (``LOOKAHEAD_CHAT_HOME``), dialogs that record
instead of blocking, and a check that no engine thread is left running.
"""

from __future__ import annotations

import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
from PySide6.QtWidgets import QMessageBox, QWidget
from pytestqt.qtbot import QtBot

from app import paths
from app.engine_thread import LIVE_THREADS
from app.settings import AppSettings
from app.store import ChatStore, StoredMessage
from engine.costs.curve import DEFAULT_CURVE, CostCurve
from engine.decoding.text import ChatTemplate
from engine.library.names import LookaheadKind
from engine.llama.models import GgufSummary
from engine.llama.native import ModelInfo

if TYPE_CHECKING:
    from PySide6.QtWidgets import QAbstractButton

    from app.attachments import Attachment
    from app.main_window import MainWindow, ReplyRecord
    from engine.decoding.runtime import Engine
    from engine.llama.problems import LoadProblem

# The offscreen platform says this whenever a top-level window's size limits change; xcb does not.
OFFSCREEN_NOISE = pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints\(\)")

MODEL_LOAD_TIMEOUT_MS = 60_000
REPLY_TIMEOUT_MS = 90_000


def send(qtbot: QtBot, window: MainWindow, text: str, attachments: tuple[Attachment, ...] = (),
         timeout_ms: int = REPLY_TIMEOUT_MS) -> ReplyRecord:
    """Attach ``attachments`` (if any), type ``text``, press Send, and wait for the reply to be saved."""
    if attachments:
        window.chat_pane.set_attachments(attachments)
    window.input.setPlainText(text)
    return click_and_wait(qtbot, window, window.send_button, timeout_ms)


def click_and_wait(qtbot: QtBot, window: MainWindow, button: QAbstractButton,
                   timeout_ms: int = REPLY_TIMEOUT_MS) -> ReplyRecord:
    """Click ``button`` (Send, Regenerate, …) and wait for the reply it starts to be saved."""
    with qtbot.waitSignal(window.replyCompleted, timeout=timeout_ms) as blocker:
        button.click()
    return blocker.args[0]


@pytest.fixture
def app_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh home for the app's data and settings."""
    home = tmp_path / "home"
    monkeypatch.setenv(paths.HOME_ENV, str(home))
    return home


@pytest.fixture(autouse=True)
def no_engine_thread_left() -> Iterator[None]:
    """Fails the test if an engine thread is still running after it (and its fixtures) ended."""
    yield
    running = [t for t in list(LIVE_THREADS) if t.isRunning()]
    assert not running, f"engine thread(s) left running: {running}"


@dataclass
class DialogLog:
    """Message boxes shown during a test, as (kind, title, text)."""

    shown: list[tuple[str, str, str]] = field(default_factory=list)

    def texts(self, kind: str | None = None) -> list[str]:
        return [text for k, _title, text in self.shown if kind is None or k == kind]


@pytest.fixture
def dialogs(monkeypatch: pytest.MonkeyPatch) -> DialogLog:
    """Records QMessageBox dialogs instead of blocking on them; questions are answered Yes."""
    log = DialogLog()

    def recorder(kind: str, answer: QMessageBox.StandardButton) -> Callable[..., QMessageBox.StandardButton]:
        def show(_parent: QWidget | None, title: str, text: str, *args: object, **kwargs: object,
                 ) -> QMessageBox.StandardButton:
            log.shown.append((kind, title, text))
            return answer

        return show

    ok = QMessageBox.StandardButton.Ok
    monkeypatch.setattr(QMessageBox, "critical", staticmethod(recorder("critical", ok)))
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(recorder("warning", ok)))
    monkeypatch.setattr(QMessageBox, "information", staticmethod(recorder("information", ok)))
    monkeypatch.setattr(QMessageBox, "question", staticmethod(recorder("question", QMessageBox.StandardButton.Yes)))

    from app.widgets import plain

    kinds = {plain.Icon.Critical: "critical", plain.Icon.Warning: "warning", plain.Icon.Information: "information",
             plain.Icon.Question: "question"}

    def ask(_parent: QWidget | None, icon: plain.Icon, title: str, text: str,
            buttons: QMessageBox.StandardButton = plain.Button.Ok) -> QMessageBox.StandardButton:
        """The app's plain-text message boxes: recorded as the kind their icon shows, questions answered Yes."""
        log.shown.append((kinds.get(icon, "message"), title, text))
        return plain.Button.Yes if icon == plain.Icon.Question else plain.Button.Ok

    monkeypatch.setattr(plain, "ask", ask)

    from app.widgets import model_info

    real_show_problem = model_info.show_problem

    def show_problem(parent: QWidget, title: str, problem: LoadProblem,
                     icon: QMessageBox.Icon = QMessageBox.Icon.Critical) -> QMessageBox:
        """The non-blocking problem box (plain words, details behind a button): recorded, then shown."""
        kind = "critical" if icon == QMessageBox.Icon.Critical else "warning"
        log.shown.append((kind, title, f"{problem.message}\n{problem.detail}"))
        return real_show_problem(parent, title, problem, icon)

    monkeypatch.setattr(model_info, "show_problem", show_problem)
    return log


def quick_settings(**overrides: Any) -> AppSettings:
    """Settings that keep model tests short and steady on a busy 2-core machine."""
    # One thread: the engine's thread pool spinning against other jobs slows small models badly.
    quick = AppSettings(threads=1, n_ctx=1024, max_tokens=24, lookahead_on=True, auto=False, window=4, ngram=4,
                        guesses=3)
    return replace(quick, **overrides)


# Files the test session has seen load in a child process: each is probed once, not in every test's new home.
_PROBE_CACHE = Path(os.environ.get("LOOKAHEAD_CHAT_HOME") or tempfile.gettempdir()) / "probed-models.json"


@pytest.fixture
def worker_options() -> dict[str, Any]:
    """What the windows' engine workers are built with; fixtures with fake engines fill in their factories."""
    from engine.llama.probe import ensure_loadable

    return {"check_loadable": functools.partial(ensure_loadable, cache=_PROBE_CACHE)}


@pytest.fixture
def make_window(
    qtbot: QtBot, app_home: Path, dialogs: DialogLog, worker_options: dict[str, Any],
) -> Iterator[Callable[..., MainWindow]]:
    """Opens MainWindows on the bundled model (waiting for it to load); closes them after the test."""
    from app.main_window import MainWindow

    windows: list[MainWindow] = []

    def make(settings: AppSettings | None = None, wait_for_model: bool = True) -> MainWindow:
        window = MainWindow(settings if settings is not None else quick_settings(), worker_options=worker_options)
        windows.append(window)
        window.show()
        if wait_for_model:
            with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
                pass
            assert window.model is not None
        return window

    yield make
    for window in windows:
        window.close()
        window.deleteLater()


def close_mid_reply(window: MainWindow) -> list[StoredMessage]:
    """Close ``window`` while a reply runs: it must exit within 2 s with its engine thread stopped.

    Returns the messages stored for the one chat.
    """
    t0 = time.perf_counter()
    window.close()
    assert time.perf_counter() - t0 < 2.0
    assert not window.engine.worker_thread.isRunning()
    store = ChatStore()
    try:
        (conv,) = store.conversations()
        return store.messages(conv.id)
    finally:
        store.close()


class WorkerEngine(Protocol):
    """What the app's engine worker (app/worker.py) uses of the engine it loads: the model's facts it reports in
    ``LoadedModel``, the earlier chats and attached files drafts come from, the cost curve for Auto, the thread probe.

    ``FakeEngine`` declares it and mypy checks below that ``Engine`` has it, so a fake that drifts from the engine
    (a method renamed, an argument added) fails mypy rather than a window test at run time.
    """

    summary: GgufSummary
    info: ModelInfo
    template: ChatTemplate
    n_ctx: int
    n_threads: int
    lookahead_block_reason: str | None
    keep_replies: bool

    @property
    def lookahead_kind(self) -> LookaheadKind: ...
    def close(self) -> None: ...
    def draft_from_earlier_chats(self) -> None: ...
    def remember_chat(self, tokens: Sequence[int]) -> None: ...
    def save_kept_ngrams(self, force: bool = False) -> None: ...
    def set_documents(self, texts: Sequence[str]) -> None: ...
    def tokenize(self, text: str, add_special: bool = True) -> list[int]: ...
    def load_cached_curve(self) -> bool: ...
    def tune(self, refresh: bool = False, budget_s: float = 6.0, progress: Callable[[float], None] | None = None,
             cancel: threading.Event | None = None) -> CostCurve: ...
    def probe_threads(self, cancel: threading.Event | None = None) -> bool: ...


class EngineFactory(Protocol):
    """How the worker makes an engine (its ``engine_factory``): ``Engine`` itself, or a fake's class."""

    def __call__(self, model_path: str | os.PathLike[str], n_ctx: int = ..., n_threads: int | None = None,
                 progress: Callable[[float], bool] | None = None, summary: GgufSummary | None = None,
                 ) -> WorkerEngine: ...


class FakeEngineEarlierChats:
    """The part of an engine the worker feeds earlier chats to, for fake engines: it keeps what it was given."""

    remembered: list[list[int]] | None = None  # None until the worker turns drafting from earlier chats on

    def draft_from_earlier_chats(self) -> None:
        self.remembered = []

    def remember_chat(self, tokens: Sequence[int]) -> None:
        if self.remembered is not None:
            self.remembered.append(list(tokens))

    def save_kept_ngrams(self, force: bool = False) -> None:
        pass

    document_texts: tuple[str, ...] = ()  # what the worker last told the engine to draft from (set_documents)

    def set_documents(self, texts: Sequence[str]) -> None:
        self.document_texts = tuple(texts)

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return [len(word) for word in text.split()]


class FakeEngine(FakeEngineEarlierChats, WorkerEngine):
    """An engine that loads at once and writes nothing itself: a fake session (``session_factory``) replies."""

    lookahead_kind = LookaheadKind.FULL

    def __init__(
        self,
        model_path: str | os.PathLike[str] | None,
        n_ctx: int = 4096,
        n_threads: int | None = None,
        progress: Callable[[float], bool] | None = None,
        summary: GgufSummary | None = None,
    ) -> None:
        """``summary`` (the probe's) is not read: a fake's facts are its own (``fake_summary``)."""
        for frac in (0.0, 0.5, 1.0):
            if progress is not None:
                progress(frac)
        self.summary = fake_summary(model_path)
        self.template = ChatTemplate(None)
        self.info = fake_model_info(1_000_000)
        self.n_ctx, self.n_threads = n_ctx, n_threads or 1
        self.lookahead_block_reason: str | None = None
        self.keep_replies = True

    def close(self) -> None:
        pass

    def load_cached_curve(self) -> bool:
        return True  # nothing to measure: the app never shows the measurement for a fake

    def tune(self, refresh: bool = False, budget_s: float = 6.0, progress: Callable[[float], None] | None = None,
             cancel: threading.Event | None = None) -> CostCurve:
        return DEFAULT_CURVE  # never asked (the curve is "cached"); fakes that measure say how

    def probe_threads(self, cancel: threading.Event | None = None) -> bool:
        return True  # nothing to probe: a fake's thread count never changes what it writes


def fake_summary(model_path: str | os.PathLike[str] | None, **facts: Any) -> GgufSummary:
    """A fake model file's header facts: a small F16 model named "Fake", with ``facts`` changed."""
    summary = GgufSummary(path=str(model_path), size_bytes=1000, architecture="fake", name="Fake", file_type="F16",
                          context_length=2048, n_tensors=4, has_chat_template=False, matrix_types=(("F16", 4),))
    return replace(summary, **facts)


def fake_model_info(n_params: int) -> ModelInfo:
    """What a fake model says of itself once loaded: only its parameter count is read."""
    return ModelInfo(path="", description="fake", n_params=n_params, size_bytes=0, n_ctx_train=0, n_vocab=0,
                     recurrent=False, hybrid=False)


if TYPE_CHECKING:

    def _the_engine_and_the_fake_agree(engine: Engine) -> None:
        """Never called: mypy checks that the engine has what ``WorkerEngine`` names, and that the engine's class and
        ``FakeEngine`` are both made as the worker makes an engine, into something that has it."""
        used: WorkerEngine = engine
        real: EngineFactory = Engine
        fake: EngineFactory = FakeEngine
        FakeEngine("fake.gguf")  # an attribute or a method of the Protocol that the fake lacks leaves it abstract
        del used, real, fake


def use_fake_engine(worker_options: dict[str, Any], session_factory: Callable[[Any], Any]) -> None:
    """Windows made after this load ``FakeEngine`` at once and reply through ``session_factory``'s sessions."""
    from engine.llama.probe import ProbeResult

    def session_reading_nothing_ahead(engine: FakeEngine) -> Any:
        session = session_factory(engine)
        if not hasattr(session, "read_ahead"):  # a fake session has no cache to read the next prompt into
            session.read_ahead = lambda *_a, **_k: 0
        return session

    worker_options.update(engine_factory=FakeEngine, session_factory=session_reading_nothing_ahead,
                          check_loadable=lambda *_a, **_k: ProbeResult(probed=False, seconds=0.0),
                          default_model=lambda: Path("/models/fake.gguf"))
