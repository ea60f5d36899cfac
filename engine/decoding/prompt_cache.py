"""What the engine's KV cache holds of committed tokens, and how a prompt gets there.

``PromptCache`` is the part of ``Engine`` (runtime.py) that keeps the cache between generations: a new
prompt evaluates only what differs from what the cache already holds (``cache_prompt``), in chunks at
fixed positions (``prefill``); the start of a prompt not sent yet can be read ahead (``read_ahead``); and
work that empties the cache (measuring, probing) can leave it as it was (``cache_kept``).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

from engine.decoding.decoders import KvState
from engine.decoding.loaded import LoadedModel

# A prompt is read in chunks that end at multiples of this position: progress shows and Stop works within
# one chunk, a fraction of a second for the bundled model even with a core busy (docs/SPEED.md, "The figures
# behind the code's constants"), and on these CPUs a 512-token batch reads no faster per token. Chunks end at
# fixed positions so that what the cache holds does not depend on where an earlier read stopped (read-ahead,
# Stop): kernels that are not exact at every batch size would otherwise give a prompt read in other pieces other
# values.
PREFILL_CHUNK = 64


class PromptCache:
    """The committed tokens in the engine's KV cache (``kv``): reused, read in chunks, read ahead, kept across work.

    It works on the loaded model's context and batch, in the sequences a committed token belongs to.
    """

    def __init__(self, loaded: LoadedModel) -> None:
        self._loaded = loaded
        self._ctx = loaded.ctx
        self._batch = loaded.batch
        self._seqs = loaded.commit_seqs
        self._recurrent = loaded.recurrent
        # One object for the engine's life (``reset`` empties it): a generation and the engine's callers hold it.
        self.kv = KvState()

    def reset(self) -> None:
        """Forget the cache (the next prompt is evaluated from scratch)."""
        self._ctx.clear()
        self.kv.tokens = []

    @contextlib.contextmanager
    def cache_kept(self) -> Iterator[None]:
        """Work inside that empties the cache (measuring, probing) leaves it holding what it held before: a chat
        read ahead, or the last reply's turn, is not read again. Copies the committed tokens' keys and values out
        and back (about a tenth of a second for a few thousand tokens of a small model)."""
        tokens = list(self.kv.tokens)
        saved = self._ctx.save_seq(self._seqs[0]) if tokens else b""
        try:
            yield
        finally:
            self.reset()
            if saved and self._ctx.load_seq(saved, self._seqs[0]):
                for seq in self._seqs[1:]:
                    self._ctx.seq_cp(self._seqs[0], seq, -1, -1)
                self.kv.tokens = tokens

    def _reuse_prefix(self, prompt: Sequence[int]) -> int:
        """Keep the longest cached prefix of ``prompt[:-1]``; drop the rest of the cache."""
        cached = self.kv.tokens
        limit = min(len(cached), len(prompt) - 1)
        n = 0
        while n < limit and cached[n] == prompt[n]:
            n += 1
        if n < len(cached) and self._recurrent:
            self.reset()  # a recurrent state cannot be rewound to an earlier position: start over
            return 0
        if n < len(cached):
            # Truncating the tail keeps the cache in position order (no holes before it).
            self._ctx.seq_rm(-1, n, -1)
            del self.kv.tokens[n:]
        return n

    def prefill(
        self,
        tokens: Sequence[int],
        progress: Callable[[int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> int:
        """Evaluate ``tokens`` after what the cache holds, in every committed sequence (no logits).

        In chunks ending at multiples of ``PREFILL_CHUNK`` positions: ``progress`` hears (evaluated, total) after
        each, and setting ``cancel`` stops between two (what was evaluated stays cached). Returns the tokens
        evaluated.
        """
        done = 0
        while done < len(tokens):
            if cancel is not None and cancel.is_set():
                break
            chunk = tokens[done : done + PREFILL_CHUNK - self.kv.n % PREFILL_CHUNK]
            self._batch.set_single_seq(chunk, self.kv.n, self._seqs, last_logits=False)
            self._ctx.decode(self._batch)
            self.kv.tokens.extend(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, len(tokens))
        return done

    def cache_prompt(
        self,
        prompt: Sequence[int],
        progress: Callable[[int, int], None] | None = None,
        cancel: threading.Event | None = None,
    ) -> int:
        """Make the cache hold ``prompt[:-1]``, reusing its longest cached prefix; returns the tokens evaluated.

        The last prompt token stays out: the first step of a generation evaluates it. ``progress`` and
        ``cancel`` as for ``prefill``.
        """
        reused = self._reuse_prefix(prompt)
        return self.prefill(prompt[reused:-1], progress, cancel)

    def read_ahead(self, tokens: Sequence[int], cancel: threading.Event | None = None) -> int:
        """Evaluate the whole chunks of ``tokens`` (the start of a prompt not sent yet) that the cache lacks.

        What the next prompt will begin with (a chat's history, its documents) is read while the user writes the
        rest, so that Send reads little more than the new words. Only whole chunks (up to a multiple of
        ``PREFILL_CHUNK``): the rest is read with the prompt, in the pieces it would have had anyway. Leaves a
        core to the user (one thread fewer) and stops between chunks when ``cancel`` is set. A recurrent model's
        state cannot be rewound, so its cache is only read ahead where it holds a prefix of ``tokens``. Returns
        the tokens evaluated.
        """
        end = len(tokens) - len(tokens) % PREFILL_CHUNK
        cached = self.kv.tokens
        if end <= len(cached) and list(cached[:end]) == list(tokens[:end]):
            return 0  # already read (and maybe more: a reply after it stays)
        if self._recurrent and list(cached) != list(tokens[: len(cached)]):
            return 0
        reused = self._reuse_prefix(list(tokens[:end]) + [-1])  # -1: no token, keeps tokens[:end] comparable
        threads = max(1, self._loaded.n_threads - 1)
        with self.threads_for_background(threads):
            return self.prefill(tokens[reused:end], cancel=cancel)

    @contextlib.contextmanager
    def threads_for_background(self, threads: int) -> Iterator[None]:
        """Decode with ``threads``, unheard by the thread governor (work the user did not ask for yet, at a
        thread count of its own); the count and the governor as they were after."""
        on_decode, before = self._ctx.on_decode, self._ctx.n_threads
        self._ctx.on_decode = None
        self._ctx.set_threads(threads)
        try:
            yield
        finally:
            self._ctx.set_threads(before)
            self._ctx.on_decode = on_decode

    def cache_positions(self) -> dict[int, tuple[int, int]]:
        """(min, max) position held by every sequence; for checking the cache discipline."""
        return {s: (self._ctx.seq_pos_min(s), self._ctx.seq_pos_max(s)) for s in self._seqs}
