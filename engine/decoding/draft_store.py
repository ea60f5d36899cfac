"""Drafts from beyond one reply: earlier chats with the model, the n-grams kept from earlier replies, and the
attached documents of the chat being answered.

``DraftStore`` is the part of ``Engine`` (runtime.py) that holds them between generations; each generation drafts
from what it holds then (generation.py), and hands its reply's n-grams back (``keep_ngrams``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence

from engine.decoding import kept as kept_ngrams
from engine.decoding.drafts import CorpusIndex, DraftCorpus
from engine.decoding.origins import DraftOrigin, DraftSource
from engine.decoding.pool import NgramPool

KEPT_SAVE_INTERVAL_S = 60.0
DOCUMENT_TOKENS = 1_000_000  # the attached documents' index holds this many tokens at most


class DraftStore:
    """Earlier chats (``corpus``), kept n-grams (``kept``) and documents (``documents``) to draft from.

    ``corpus`` and ``kept`` are None until a caller opens them (the app: ``draft_from_earlier_chats``); benchmarks
    set their own. ``keep_replies``: merge each reply's n-grams into ``kept`` (benchmarks turn it off).
    """

    def __init__(self, model_path: str | os.PathLike[str], tokenize_text: Callable[[str], list[int]]) -> None:
        """``model_path``: the file the kept n-grams are stored for; ``tokenize_text``: a document's text in tokens,
        a control token's text read as text."""
        self._model_path = model_path
        self._tokenize_text = tokenize_text
        self.corpus: CorpusIndex | None = None
        self.kept: NgramPool | None = None
        # The attached documents of the chat being answered, whole (set_documents); their drafts' origin is
        # DraftOrigin.DOCUMENT.
        self.documents: DraftCorpus | None = None
        self.keep_replies = True
        self._documents_key: tuple[str, ...] = ()
        self._kept_on_disk = False
        self._kept_changed = False
        self._kept_saved_at = 0.0

    def draft_from_earlier_chats(self) -> None:
        """Draft from earlier chats (fed by ``remember_chat``) and from the n-grams kept on disk for this file."""
        if self.corpus is None:
            self.corpus = CorpusIndex()
        if not self._kept_on_disk:
            self.kept = kept_ngrams.load(self._model_path)
            self._kept_on_disk = True

    def remember_chat(self, tokens: Sequence[int]) -> None:
        """Add a chat's text (token ids, its messages in order) to the drafts from earlier chats."""
        if self.corpus is not None:
            self.corpus.add(tokens)

    def set_documents(self, texts: Sequence[str]) -> None:
        """Draft from these documents' whole text (the parts not in the prompt too) until set again.

        Setting the same texts again keeps the index (a chat's next turn); ``[]`` drops it.
        """
        key = tuple(texts)
        if key == self._documents_key:
            return
        self._documents_key = key
        if not texts:
            self.documents = None
            return
        index = CorpusIndex(max_tokens=DOCUMENT_TOKENS, source=DraftSource.DOCUMENT, origin=DraftOrigin.DOCUMENT)
        for text in texts:  # a document's "<|im_end|>" is text, not a control token
            index.add(self._tokenize_text(text))
        self.documents = index

    def keep_ngrams(self, pool: NgramPool) -> None:
        """Merge a finished reply's n-grams into the kept pool (when there is one)."""
        if self.kept is not None and self.keep_replies:
            kept_ngrams.keep(self.kept, pool)
            self._kept_changed = True

    def save_kept_ngrams(self, force: bool = False) -> None:
        """Write the kept n-grams to disk if they came from there and changed: at most once a minute
        (a full pool takes a quarter of a second to write) unless ``force``."""
        if not (self._kept_on_disk and self._kept_changed and self.kept is not None):
            return
        if force or time.monotonic() - self._kept_saved_at >= KEPT_SAVE_INTERVAL_S:
            kept_ngrams.save(self._model_path, self.kept)
            self._kept_changed = False
            self._kept_saved_at = time.monotonic()
