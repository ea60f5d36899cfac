"""Chat turns on top of the engine: template, context policy, cache reuse.

The conversation is passed in whole each turn; the engine keeps the KV cache
of the previous turn and evaluates only the tokens that differ, so the time to
the first token depends on the new message, not on the length of the history.

Context policy: when the conversation does not fit (prompt plus room for the
reply), the oldest turns are dropped, always keeping the system prompt and
the latest user message. What was dropped is reported in the first event.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

from engine.decoding.attaching import attach_documents
from engine.decoding.runtime import Engine, GenerationControls, PromptTooLongError, StepEvent
from engine.decoding.settings import SamplingConfig, StopConfig
from engine.decoding.text import Message
from engine.documents import Document, DocumentContext

DOCUMENT_MARGIN = 32  # tokens: the passages' headings are counted, a tokenizer's merges at their edges are not


@dataclass(frozen=True)
class FittedPrompt:
    tokens: list[int]
    dropped: int  # messages left out, oldest first
    history: list[int]  # tokens of the dropped messages (still useful as drafts)
    system_tokens: int = 0  # of ``tokens``, those the system prompt adds


class ChatSession:
    """Turns a list of messages into a generation that fits the context."""

    def __init__(self, engine: Engine, min_reply_room: int = 128) -> None:
        self.engine = engine
        self.min_reply_room = min_reply_room

    def reply_room(self, max_tokens: int) -> int:
        """The context kept for the reply: ``max_tokens``, but at least ``min_reply_room`` and at most a quarter."""
        return min(max_tokens, max(self.min_reply_room, self.engine.n_ctx // 4))

    def documents_context(
        self, messages: Sequence[Message], docs: Sequence[Document], max_tokens: int,
    ) -> DocumentContext:
        """What of ``docs`` goes into the last (user) message of ``messages``.

        Whole when they fit beside the system prompt and the question with room for the reply, else the
        passages that best match the question in that room; ``fit`` then drops earlier turns as it must.
        """
        system = [m for m in messages[:1] if m.role == "system"]
        base = len(self.engine.render_chat([*system, messages[-1]]))
        budget = self.engine.n_ctx - self.reply_room(max_tokens) - base - DOCUMENT_MARGIN
        return DocumentContext.build(
            docs, messages[-1].content, budget, lambda text: len(self.engine.tokenize(text, add_special=False))
        )

    def fit(self, messages: Sequence[Message], max_tokens: int) -> FittedPrompt:
        """Tokenize ``messages``, dropping the oldest turns until prompt + reply room fits."""
        if not messages or messages[-1].role != "user":
            raise ValueError("a chat turn must end with a user message")
        room = self.reply_room(max_tokens)
        limit = self.engine.n_ctx - room
        system = [m for m in messages[:1] if m.role == "system"]
        turns = list(messages[len(system) :])
        dropped: list[Message] = []
        while True:
            tokens = self.engine.render_chat(system + turns)
            if len(tokens) <= limit:
                break
            if len(turns) <= 1:
                raise PromptTooLongError(
                    f"the message is {len(tokens)} tokens with the system prompt, but the context holds "
                    f"{self.engine.n_ctx} with {room} kept for the reply; shorten it or raise the context size"
                )
            # Drop whole exchanges: a user message and the replies after it.
            dropped.append(turns.pop(0))
            while len(turns) > 1 and turns[0].role != "user":
                dropped.append(turns.pop(0))
        history: list[int] = []
        if dropped:
            history = self.engine.tokenize("\n".join(m.content for m in dropped), add_special=False)
        # The system prompt's share: its text's tokens (the template's markers around it are not counted; some
        # templates put a default system prompt in when there is none, so rendering without it says nothing).
        system_tokens = len(self.engine.tokenize(system[0].content, add_special=False)) if system else 0
        return FittedPrompt(tokens=tokens, dropped=len(dropped), history=history, system_tokens=system_tokens)

    def reply(
        self,
        messages: Sequence[Message],
        controls: GenerationControls | None = None,
        sampling: SamplingConfig = SamplingConfig(),
        stop: StopConfig = StopConfig(),
        drafts_from: Sequence[str] = (),
    ) -> Iterator[StepEvent]:
        """Generate the assistant's reply to ``messages`` (which end with the user's turn).

        ``drafts_from``: texts that are not part of the conversation but that
        the reply may repeat, such as the reply it regenerates or the turn an
        edit replaces; lookahead drafts from them as from the history.
        """
        fitted = self.fit(messages, stop.max_tokens)
        notice = ""
        if fitted.dropped:
            notice = (f"context full: left out the {fitted.dropped} oldest message(s), "
                      "kept the system prompt and the latest turn")
        history = list(fitted.history)
        for text in drafts_from:
            if text:
                history += self.engine.tokenize(text, add_special=False)
        events = self.engine.generate(
            fitted.tokens, controls=controls, sampling=sampling, stop=stop, history=history, notice=notice
        )
        return _with_context(events, fitted)

    def read_ahead(
        self,
        messages: Sequence[Message],
        docs: Sequence[Document] = (),
        max_tokens: int = 512,
        cancel: threading.Event | None = None,
    ) -> int:
        """Read into the cache what the prompt of the next user message will begin with: ``messages`` (the chat so
        far) and ``docs`` (files attached to the message being written), up to where its words will go.

        That start is what two renderings with different words share, so any template's markers count. Returns
        the tokens evaluated (0 when the cache already holds them or the chat does not fit).
        """
        turns = []
        for words in ("", "x"):
            draft = [*messages, Message("user", words)]
            if docs:
                draft, _ = attach_documents(self, draft, docs, max_tokens)
            try:
                turns.append(self.fit(draft, max_tokens).tokens)
            except PromptTooLongError:
                return 0
        shared = 0
        for a, b in zip(*turns, strict=False):
            if a != b:
                break
            shared += 1
        return self.engine.read_ahead(turns[0][:shared], cancel=cancel)


def _with_context(events: Iterator[StepEvent], fitted: FittedPrompt) -> Iterator[StepEvent]:
    """``events`` with the first one telling what the context holds (dropped messages, system tokens)."""
    first = True
    for ev in events:
        if first:
            ev = replace(ev, dropped_messages=fitted.dropped, system_tokens=fitted.system_tokens)
            first = False
        yield ev
