"""The rows of the chat database as dataclasses: a conversation, a stored message, a message to write."""

from __future__ import annotations

from dataclasses import dataclass

from ..attachments import Attachment, ReplySources, attachments_from_json


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    system_prompt: str
    created: float
    updated: float
    current_leaf_id: int | None = None  # the last message of the branch the chat shows


CONVERSATION_COLUMNS = "id, title, system_prompt, created, updated, current_leaf_id"


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    created: float
    stats_json: str | None = None
    marks_json: str | None = None  # app.marks.TokenMarks, for replies
    parent_id: int | None = None  # the message this one follows (None: the chat's first)
    attachments_json: str | None = None  # app.attachments: the files a user's message came with
    documents_json: str | None = None  # app.attachments.ReplySources: what of them the model was given

    @property
    def attachments(self) -> tuple[Attachment, ...]:
        """The files this message came with (none for most)."""
        return attachments_from_json(self.attachments_json)

    @property
    def documents(self) -> ReplySources | None:
        """What of its files the model was given (None: no files, or not placed yet)."""
        return ReplySources.from_json(self.documents_json)


MESSAGE_COLUMNS = (
    "id, conversation_id, role, content, created, stats_json, marks_json, parent_id, attachments_json, documents_json"
)


@dataclass(frozen=True)
class MessageNode:
    """A message of a chat written all at once (fork, import): ``key`` and ``parent`` are the caller's ids."""

    key: int
    parent: int | None
    role: str
    content: str
    created: float
    stats_json: str | None = None
    marks_json: str | None = None
    attachments_json: str | None = None
    documents_json: str | None = None

    @classmethod
    def of(cls, m: StoredMessage) -> MessageNode:
        return cls(m.id, m.parent_id, m.role, m.content, m.created, m.stats_json, m.marks_json,
                   m.attachments_json, m.documents_json)
