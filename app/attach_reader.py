"""Reads attached files off the GUI thread: one job per file, each with its progress and a way to cancel it.

``engine.documents.read_document`` does the reading (limits, encodings, PDF and
DOCX); this module only runs it on a thread pool and hands the result back to
the GUI thread as a signal. A PDF of hundreds of pages takes seconds to read,
and the window must stay responsive meanwhile.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from PySide6.QtCore import QObject, QThreadPool, Signal, Slot

from engine.documents import DocumentError, ReadCancelled, read_document

from .attachments import Attachment

# Progress is told at most this often per job (in 0..1 steps): a 300-page PDF would otherwise post 300 events.
_PROGRESS_STEP = 0.02


@dataclass(frozen=True)
class ReadResult:
    """How one read ended: the attachment, or the reason it could not be read (``error``), or cancelled."""

    job: int
    path: str
    attachment: Attachment | None = None
    error: str = ""  # "<file name>: <plain reason>" (DocumentError's text)
    detail: str = ""  # the technical cause, when there is one
    cancelled: bool = False


class _JobSignals(QObject):
    """What the jobs on the pool tell the GUI thread (queued: they emit from the pool's threads)."""

    progress = Signal(int, float)
    finished = Signal(object)


def _read(job: int, path: str, cancel: threading.Event, signals: _JobSignals) -> None:
    """Runs on the pool: read the file and say how it went. Every exception ends as a result, never on the pool."""
    told = [0.0]

    def progress(fraction: float) -> None:
        if fraction >= 1.0 or fraction - told[0] >= _PROGRESS_STEP:
            told[0] = fraction
            signals.progress.emit(job, fraction)

    try:
        doc = read_document(path, cancel=cancel, progress=progress)
        result = ReadResult(job, path, Attachment.from_document(doc, path=path))
    except ReadCancelled:
        result = ReadResult(job, path, cancelled=True)
    except DocumentError as exc:
        result = ReadResult(job, path, error=str(exc), detail=exc.detail)
    except Exception as exc:  # noqa: BLE001 (a reader's bug must not end the app: it is that file's problem)
        result = ReadResult(job, path, error=f"{Path(path).name}: it could not be read",
                            detail=f"{type(exc).__name__}: {exc}")
    if cancel.is_set() and result.attachment is not None:
        result = ReadResult(job, path, cancelled=True)  # cancelled after the last page: still cancelled
    signals.finished.emit(result)


def _cancel_all(events: dict[int, threading.Event]) -> None:
    for event in list(events.values()):
        event.set()


class AttachmentReader(QObject):
    """Starts reads and forwards how they go; ``shutdown()`` (or deleting it) cancels and waits for them.

    Signals:
        progress(int, float): job id, share of it read so far (PDFs tell it page by page).
        finished(object): a ``ReadResult``, once per job (also for a cancelled one).
    """

    progress = Signal(int, float)
    finished = Signal(object)

    def __init__(self, parent: QObject | None = None, max_threads: int = 2) -> None:
        super().__init__(parent)
        # The pool is the first child, so deleting the reader waits for the jobs before the signals they emit go.
        self._pool = QThreadPool(self)
        self._pool.setMaxThreadCount(max_threads)
        self._signals = _JobSignals(self)
        self._signals.progress.connect(self.progress)
        self._signals.finished.connect(self._on_job_finished)
        self._next_job = 1
        self._events: dict[int, threading.Event] = {}
        # Deleting the reader deletes the pool, which waits for its jobs: cancel them first, so that is quick.
        self.destroyed.connect(partial(_cancel_all, self._events))

    def start(self, path: str | Path) -> int:
        """Read ``path`` on the pool; returns the job's id (``finished`` tells how it went)."""
        job = self._next_job
        self._next_job += 1
        cancel = threading.Event()
        self._events[job] = cancel
        self._pool.start(partial(_read, job, str(path), cancel, self._signals))
        return job

    def cancel(self, job: int) -> None:
        """Ask a job to stop (it reports ``cancelled`` when it has)."""
        event = self._events.get(job)
        if event is not None:
            event.set()

    def running(self) -> list[int]:
        """The jobs that have not reported yet."""
        return list(self._events)

    def shutdown(self, timeout_ms: int = 5000) -> bool:
        """Cancel every job and wait for the pool's threads (True if they all ended in time)."""
        _cancel_all(self._events)
        return self._pool.waitForDone(timeout_ms)

    @Slot(object)
    def _on_job_finished(self, result: object) -> None:
        assert isinstance(result, ReadResult)
        self._events.pop(result.job, None)
        self.finished.emit(result)
