"""The chat's logic: the open chat, its edit state, turns, request ids and what is written to the store. No Qt here.

``ChatController`` is the open chat: which conversation is shown, the message
being edited, and what may be done to the chats (fork, flip alternatives,
delete) while no reply streams. ``Turns`` (its ``turns``) is the reply in
flight. A turn goes: ``begin_send``/``begin_regenerate`` builds the worker's
request (nothing is saved yet) → ``accept`` when the worker has taken it (the
conversation and the user's message are written now, and only now) →
``observe`` for every step → ``finish`` saves the reply as far as it got.
``reject`` forgets a turn the worker refused; nothing of it was saved. The
window shows what these return and sends the requests; it never writes to the
store itself.

A user's message may come with files (``app.attachments``), saved with it. The
worker places what fits of them before the message's text and says what it
placed (``DocumentsPlaced``); ``place_documents`` saves that on the message, and
every later turn sends the message with that same text before it, so the model
reads the conversation as it did (the cache is reused, follow-up questions still
see the files). Every reply drafts from the whole text of every file on its branch.

Nothing is deleted by an edit or a regeneration: the new message is saved
beside the one it replaces (the same parent in the store's tree of messages),
and the chat goes on from the branch shown.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from engine import LookaheadConfig, SamplingConfig, StepEvent, StopConfig
from engine.decoding.text import conversation_messages

from .attachments import Attachment, ReplySources, as_the_model_read_it
from .backup import export_markdown
from .marks import TokenMarks
from .requests import DocumentsPlaced, GenerationRequest, ReadAheadRequest, ReplyOutcome
from .stats import ReplyStats
from .store import ChatStore, Conversation, StoredMessage

NEW_CHAT_TITLE = "New chat"
TITLE_LENGTH = 40


def chat_title(text: str) -> str:
    """A new chat's title: the first line of its first message, cut at a word with "…" when long."""
    line = " ".join((text.strip().splitlines() or [""])[0].split())
    if len(line) <= TITLE_LENGTH:
        return line or NEW_CHAT_TITLE
    cut = line[:TITLE_LENGTH]
    if " " in cut and line[TITLE_LENGTH] != " ":
        cut = cut[:cut.rindex(" ")]  # the last whole word (a single long word is cut where it must be)
    return cut.rstrip(" ,;:") + "…"


def file_stem(title: str) -> str:
    """A chat's title as a file name (without the extension) any file system takes."""
    return "".join(c if c.isalnum() or c in " -_" else "_" for c in title).strip() or "chat"


class RequestIds:
    """Ids for the worker's requests (replies, comparisons, speed reports): one counter for all."""

    def __init__(self) -> None:
        self._counter = itertools.count(1)

    def next(self) -> int:
        return next(self._counter)


@dataclass
class Turn:
    """The reply being generated, from Send until the worker says it is over."""

    request_id: int
    conversation_id: int | None  # None: a new chat, created once the worker accepts the message
    user_text: str | None  # None when regenerating ("" for a message that is only files)
    replaces: int | None  # the message an edit or a regeneration replaces (it stays, as an alternative)
    system_prompt: str
    auto: bool
    history: list[StoredMessage] = field(default_factory=list)  # the messages the new one follows
    reply_parent: int | None = None  # the message the reply follows, once the turn is accepted
    typed: str = ""  # the input box's text as typed, given back if the worker refuses the message
    sent_at: float = field(default_factory=time.perf_counter)
    started: bool = False
    text: str = ""
    stats: ReplyStats = field(default_factory=ReplyStats)
    marks: TokenMarks = field(default_factory=TokenMarks)  # how each run of ``text`` came
    chat_settings: dict[str, Any] = field(default_factory=dict)  # saved with the chat once accepted
    attachments: tuple[Attachment, ...] = ()  # the new message's files (saved with it once accepted)
    # What of the files the message it answers came with the reply is given (None: no files). Known at once
    # when that message's files were placed before (regenerate), else once the worker placed them.
    sources: ReplySources | None = None


@dataclass(frozen=True)
class ReplyRecord:
    """A reply that has been saved: what the window emits in ``replyCompleted``."""

    conversation_id: int
    message_id: int | None  # None if nothing was saved (stopped before any text)
    text: str
    stats: ReplyStats
    outcome: ReplyOutcome


@dataclass(frozen=True)
class TurnSettings:
    """What the decoding panel says when a turn starts."""

    system_prompt: str
    lookahead: LookaheadConfig | None
    sampling: SamplingConfig
    stop: StopConfig
    chat_settings: dict[str, Any] = field(default_factory=dict)  # the sampling values the chat keeps


class ChatController:
    """The open chat: which conversation is shown and the message being edited; the turn in flight is ``turns``'."""

    def __init__(self, store: ChatStore, ids: RequestIds) -> None:
        self.store = store
        self.conversation_id: int | None = None
        self.editing_message_id: int | None = None
        self.turns = Turns(self, ids)

    # --- state ---

    def is_generating(self) -> bool:
        return self.turns.turn is not None

    def messages(self) -> list[StoredMessage]:
        """The open chat's stored messages (none for a new chat)."""
        return self.store.messages(self.conversation_id) if self.conversation_id is not None else []

    def alternatives(self) -> dict[int, list[int]]:
        """The open chat's messages that have alternatives, each with all of them (``ChatStore.alternatives``)."""
        return self.store.alternatives(self.conversation_id) if self.conversation_id is not None else {}

    def history_before(self, at: int | None) -> tuple[list[StoredMessage], list[StoredMessage]]:
        """The branch shown before message ``at``, and ``at`` with those after it (``at`` None: all, none)."""
        messages = self.messages()
        cut = next((k for k, m in enumerate(messages) if m.id == at), len(messages))
        return messages[:cut], messages[cut:]

    def start_edit(self, message_id: int) -> str | None:
        """Edit a user message of the open chat: returns its text for the input box (None if not editable)."""
        if self.is_generating():
            return None
        for m in self.messages():
            if m.id == message_id and m.role == "user":
                self.editing_message_id = message_id
                return m.content
        return None

    def attachments_of(self, message_id: int) -> tuple[Attachment, ...]:
        """The files a message came with (Edit puts them back beside its text)."""
        message = self.store.message(message_id)
        return message.attachments if message is not None else ()

    def cancel_edit(self) -> bool:
        """Leave edit mode; True if there was an edit to cancel."""
        editing, self.editing_message_id = self.editing_message_id, None
        return editing is not None

    # --- conversations ---

    def markdown_export(self) -> tuple[str, str] | None:
        """(a file name made from the title, the open chat as Markdown); None for a new, unsaved chat."""
        conv = self.store.conversation(self.conversation_id) if self.conversation_id is not None else None
        if conv is None:
            return None
        return f"{file_stem(conv.title)}.md", export_markdown(conv, self.store.messages(conv.id))

    def show_alternative(self, message_id: int) -> bool:
        """Show the branch through ``message_id`` (one of a message's alternatives); False while a reply streams."""
        if self.is_generating():
            return False
        self.store.select_branch(message_id)
        return True

    def fork(self, message_id: int) -> Conversation | None:
        """A new chat with the branch down to ``message_id``, now the open one; None while a reply streams."""
        if self.is_generating():
            return None
        conv = self.store.fork_conversation(message_id)
        self.conversation_id = conv.id
        return conv

    def open_message(self, conversation_id: int, message_id: int) -> bool:
        """Open a chat at one of its messages (a search result): its branch is shown; False while a reply streams."""
        if self.is_generating() or self.store.conversation(conversation_id) is None:
            return False
        self.store.select_branch(message_id)
        self.conversation_id = conversation_id
        return True

    def rename_conversation(self, conversation_id: int, title: str) -> None:
        self.store.rename_conversation(conversation_id, title)

    def set_system_prompt(self, text: str) -> None:
        """The open chat keeps the system prompt typed for it (a new chat gets it when first saved)."""
        if self.conversation_id is not None:
            self.store.set_system_prompt(self.conversation_id, text)

    def delete_conversation(self, conversation_id: int) -> bool:
        """Delete a chat; True if a reply streaming into it lost its place (the caller stops it)."""
        turn = self.turns.turn
        orphaned = turn is not None and turn.conversation_id == conversation_id
        if turn is not None and orphaned:
            turn.conversation_id = None  # the partial reply has nowhere to go
        self.store.delete_conversation(conversation_id)
        if conversation_id == self.conversation_id:
            self.conversation_id = None
        return orphaned


class Turns:
    """The reply being generated for the open chat (``turn``), from its request to its reply saved."""

    def __init__(self, chat: ChatController, ids: RequestIds) -> None:
        self.chat = chat
        self.ids = ids
        self.turn: Turn | None = None

    # --- starting a turn ---

    def begin_send(
        self, user_text: str, typed: str, settings: TurnSettings, attachments: Sequence[Attachment] = ()
    ) -> tuple[Turn, GenerationRequest]:
        """A new user message, maybe with files (or an edited one, beside it: what followed stays on the old
        branch)."""
        history, replaced = self.chat.history_before(self.chat.editing_message_id)
        return self._begin(history, user_text, replaced, typed, settings, tuple(attachments))

    def begin_regenerate(self, settings: TurnSettings) -> tuple[Turn, GenerationRequest] | None:
        """The last reply again, beside it; None if the chat has no user message to answer."""
        history = self.chat.messages()
        replaced: list[StoredMessage] = []
        while history and history[-1].role == "assistant":
            replaced.insert(0, history.pop())
        if not history:
            return None
        return self._begin(history, None, replaced, "", settings)

    def _begin(
        self,
        history: list[StoredMessage],
        user_text: str | None,
        replaced: list[StoredMessage],
        typed: str,
        settings: TurnSettings,
        attachments: tuple[Attachment, ...] = (),
    ) -> tuple[Turn, GenerationRequest]:
        turns = [(m.role, as_the_model_read_it(m.content, m.documents)) for m in history]
        to_place = attachments
        user_words = None
        sources = None
        if user_text is None and history:  # regenerate: the message answered is sent as it was before
            last = history[-1]
            sources = last.documents
            if sources is not None:
                user_words = last.content
            elif last.attachments:  # saved with files the worker never placed (it stopped first): place them now
                to_place = last.attachments
        request = GenerationRequest(
            request_id=self.ids.next(),
            messages=tuple(conversation_messages(settings.system_prompt, turns, user_text)),
            lookahead=settings.lookahead,
            sampling=settings.sampling,
            stop=settings.stop,
            # A regenerated or re-asked reply often says much of what it replaces: free drafts.
            drafts_from=tuple(m.content for m in replaced),
            attachments=to_place,
            documents=tuple(a.text for m in history for a in m.attachments) + tuple(a.text for a in attachments),
            user_words=user_words,
        )
        self.turn = Turn(
            request_id=request.request_id,
            conversation_id=self.chat.conversation_id,
            user_text=user_text,
            replaces=replaced[0].id if replaced else None,
            system_prompt=settings.system_prompt,
            auto=settings.lookahead is not None and settings.lookahead.auto,
            history=history,
            typed=typed,
            chat_settings=dict(settings.chat_settings),
            attachments=attachments,
            sources=sources,
        )
        return self.turn, request

    def read_ahead_request(self, settings: TurnSettings, attachments: Sequence[Attachment] = ()) -> ReadAheadRequest:
        """The start of the prompt the next Send would build (the branch in view, before a message being edited,
        and the files attached so far), for the worker to read while the user writes."""
        history, _replaced = self.chat.history_before(self.chat.editing_message_id)
        turns = [(m.role, as_the_model_read_it(m.content, m.documents)) for m in history]
        return ReadAheadRequest(
            messages=tuple(conversation_messages(settings.system_prompt, turns)),
            attachments=tuple(attachments),
            max_tokens=settings.stop.max_tokens,
        )

    # --- the worker's answers ---

    def current(self, request_id: int) -> Turn | None:
        """The turn in flight if ``request_id`` is its request (answers to older requests are ignored)."""
        turn = self.turn
        return turn if turn is not None and turn.request_id == request_id else None

    def accept(self, request_id: int) -> Turn | None:
        """The worker took the request: save the new chat and the user's message (beside any it replaces)."""
        turn = self.current(request_id)
        store = self.chat.store
        if turn is None:
            return None
        turn.started = True
        if turn.conversation_id is None:
            named = turn.user_text or (turn.attachments[0].name if turn.attachments else "") or NEW_CHAT_TITLE
            title = chat_title(named)
            turn.conversation_id = store.create_conversation(title, turn.system_prompt).id
            self.chat.conversation_id = turn.conversation_id
        if turn.chat_settings:  # merged: the chat may keep other settings too
            saved = store.conversation_settings(turn.conversation_id)
            store.set_conversation_settings(turn.conversation_id, {**saved, **turn.chat_settings})
        after = turn.history[-1].id if turn.history else None
        if turn.user_text is not None:
            turn.reply_parent = store.add_message(
                turn.conversation_id, "user", turn.user_text, parent_id=after, attachments=turn.attachments
            ).id
            self.chat.editing_message_id = None
        else:
            turn.reply_parent = after
            if after is not None:
                store.set_current_leaf(after)  # the chat shows what the new reply follows
        return turn

    def place_documents(self, placed: DocumentsPlaced) -> Turn | None:
        """The worker placed the files of the message being answered: save what the model was given of them
        (and each file's token count, now known) on that message."""
        turn = self.current(placed.request_id)
        store = self.chat.store
        if turn is None or turn.reply_parent is None:
            return None
        turn.sources = replace(placed.sources, text=placed.text)
        message = store.message(turn.reply_parent)
        if message is not None:
            counted = tuple(replace(a, tokens=placed.tokens.get(a.name, a.tokens)) for a in message.attachments)
            store.set_placed_documents(message.id, turn.sources, counted)
        return turn

    def note_step(self, request_id: int, event: StepEvent) -> Turn | None:
        """A step arrived (before the window draws it): times the wait for the first token.

        TTFT is what the user waited, from Send; set here, before ``observe`` folds the
        step in, it is kept instead of the engine's own share of the wait.
        """
        turn = self.current(request_id)
        if turn is not None and turn.stats.first_token_s is None and event.token_ids:
            turn.stats.first_token_s = time.perf_counter() - turn.sent_at
        return turn

    def observe(self, events: Sequence[StepEvent]) -> list[int]:
        """Fold drawn steps into the turn's text and statistics; returns the tokens each forward pass committed."""
        turn = self.turn
        if turn is None:
            return []
        committed = []
        for ev in events:
            turn.stats.observe(ev, auto=turn.auto)
            turn.text += ev.text
            turn.marks.observe(ev)
            if ev.mode != "none":
                committed.append(ev.n_committed)
        return committed

    def finish(self, outcome: ReplyOutcome, model_name: str) -> tuple[Turn, ReplyRecord] | None:
        """The generation is over: save the reply as far as it got (an empty stopped one is dropped).

        A regeneration that saved nothing shows the reply it was to replace again.
        """
        turn = self.current(outcome.request_id)
        store = self.chat.store
        if turn is None:
            return None
        self.turn = None
        turn.stats.model = model_name
        if turn.stats.stop_reason is None:
            turn.stats.stop_reason = outcome.stop_reason
        message_id = None
        if turn.conversation_id is not None and (turn.text or outcome.stop_reason != "cancelled"):
            message_id = store.add_message(
                turn.conversation_id, "assistant", turn.text, turn.stats.to_stats_json(), turn.marks.to_json(),
                parent_id=turn.reply_parent,
            ).id
        elif turn.user_text is None and turn.replaces is not None and turn.conversation_id is not None:
            store.select_branch(turn.replaces)
        return turn, ReplyRecord(turn.conversation_id or 0, message_id, turn.text, turn.stats, outcome)

    def reject(self, request_id: int) -> Turn | None:
        """The worker refused the request: forget the turn (nothing of it was saved)."""
        turn = self.current(request_id)
        if turn is not None:
            self.turn = None
        return turn
