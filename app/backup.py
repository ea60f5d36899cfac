"""Chats written to files: one chat as Markdown to read (File → Export chat…), and chats as a JSON file
(File → Export … as JSON / Import chats from JSON…), and back.

The JSON format, version 1::

    {
      "format": "lookahead-chat",
      "version": 1,
      "exported": "2025-01-31T12:00:00+00:00",      # when the file was written (ISO 8601, UTC)
      "conversations": [
        {
          "title": "…",
          "system_prompt": "…",
          "created": 1738324800.0,                  # seconds since 1970 (UTC), as the store keeps them
          "updated": 1738324900.0,
          "settings": {…},                           # the chat's own settings ({} if none)
          "messages": [                              # every branch, each message after its parent
            {
              "id": 1,                               # ids are the file's own, unique within the chat
              "parent": null,                        # the id of the message this one follows; null: the first
              "role": "user" | "assistant" | "system",
              "content": "…",
              "created": 1738324800.0,
              "stats": {…} | null,                   # a reply's statistics (app.stats.ReplyStats)
              "marks": [[chars, source, step, batch], …] | null,  # how the reply's text came (app.marks)
              "attachments": [{…}, …] | null,        # files a user's message came with, their text kept
                                                     # (app.attachments.Attachment.to_dict)
              "documents": {"text": …, "citations": […], "coverage": {…}, "whole": …} | null
                                                     # what of them the model was given (ReplySources)
            }
          ],
          "current_leaf": 2                          # the last message of the branch shown (null: the last one)
        }
      ]
    }

Messages that share a parent and a role are alternatives (an edited message, a regenerated
reply). "attachments" and "documents" may be absent (files written before messages had them).
Importing never overwrites: each chat in the file becomes a new chat with new ids.
A file is checked whole before anything is imported, so a bad file imports nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

from .attachments import Attachment, ReplySources, attachments_to_json
from .store import ChatStore, Conversation, MessageNode, StoredMessage

FORMAT = "lookahead-chat"
VERSION = 1
_ROLES = ("system", "user", "assistant")
_KIND_NAMES = {str: "text", int: "an integer", float: "a number", dict: "an object", list: "a list"}


class BackupError(ValueError):
    """A file that is not a chat export this version can read (the message says why, for the user)."""


def export_json(store: ChatStore, conversation_ids: Iterable[int] | None = None) -> str:
    """The chats ``conversation_ids`` (None: all, most recent first) as a version-1 JSON document."""
    ids = [c.id for c in store.conversations()] if conversation_ids is None else list(conversation_ids)
    chats = []
    for cid in ids:
        conv = store.conversation(cid)
        if conv is not None:
            chats.append(_conversation(store, conv))
    document = {
        "format": FORMAT,
        "version": VERSION,
        "exported": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "conversations": chats,
    }
    return json.dumps(document, ensure_ascii=False)


def _conversation(store: ChatStore, conv: Conversation) -> dict[str, Any]:
    shown = store.messages(conv.id)
    return {
        "title": conv.title,
        "system_prompt": conv.system_prompt,
        "created": conv.created,
        "updated": conv.updated,
        "settings": store.conversation_settings(conv.id),
        "messages": [_message(m) for m in store.tree(conv.id)],
        "current_leaf": shown[-1].id if shown else None,
    }


def _message(m: StoredMessage) -> dict[str, Any]:
    return {
        "id": m.id,
        "parent": m.parent_id,
        "role": m.role,
        "content": m.content,
        "created": m.created,
        "stats": _parsed(m.stats_json),
        "marks": _parsed(m.marks_json),
        "attachments": _parsed(m.attachments_json),
        "documents": _parsed(m.documents_json),
    }


def _parsed(text: str | None) -> Any:
    """Stored JSON as a value of the document (an unreadable one, which the app ignores too, as null)."""
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def import_json(store: ChatStore, text: str) -> list[Conversation]:
    """Add every chat of an exported document to the store, as new chats; returns them.

    Raises ``BackupError`` (and imports nothing) if the document is not one this version reads.
    """
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise BackupError(f"The file is not JSON ({exc}).") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise BackupError("The file is not a Lookahead Chat export (it has no \"format\": \"lookahead-chat\").")
    version = document.get("version")
    if not isinstance(version, int) or version < 1:
        raise BackupError(f"The file has no valid format version ({version!r}).")
    if version > VERSION:
        raise BackupError(
            f"The file is format version {version}, from a newer Lookahead Chat; this one reads up to {VERSION}."
        )
    chats = document.get("conversations")
    if not isinstance(chats, list):
        raise BackupError("The file has no list of conversations.")
    plans = [_plan(chat, k + 1) for k, chat in enumerate(chats)]  # all checked before any is written
    return [store.insert_conversation(**plan) for plan in plans]


def _plan(chat: object, number: int) -> dict[str, Any]:
    """One exported chat, checked, as ``ChatStore.insert_conversation``'s arguments."""
    where = f"conversation {number}"
    if not isinstance(chat, dict):
        raise BackupError(f"{where} is not an object.")
    title = _field(chat, "title", str, where)
    messages = _field(chat, "messages", list, where)
    nodes: list[MessageNode] = []
    seen: set[int] = set()
    for k, m in enumerate(messages):
        at = f"message {k + 1} of {where} (“{title}”)"
        if not isinstance(m, dict):
            raise BackupError(f"{at} is not an object.")
        key = _field(m, "id", int, at)
        parent = _field(m, "parent", int, at, optional=True)
        role = _field(m, "role", str, at)
        if role not in _ROLES:
            raise BackupError(f"{at} has an unknown role {role!r}.")
        if key in seen:
            raise BackupError(f"{at} repeats the id {key}.")
        if parent is not None and parent not in seen:
            raise BackupError(f"{at} comes before its parent {parent}, or the parent is missing.")
        seen.add(key)
        stats = _field(m, "stats", dict, at, optional=True)
        marks = _field(m, "marks", list, at, optional=True)
        nodes.append(MessageNode(
            key, parent, role, _field(m, "content", str, at), float(_field(m, "created", float, at)),
            None if stats is None else json.dumps(stats), None if marks is None else json.dumps(marks),
            _attachments(m, at), _documents(m, at),
        ))
    leaf = _field(chat, "current_leaf", int, where, optional=True)
    if leaf is not None and leaf not in seen:
        raise BackupError(f"{where} (“{title}”) shows a message it does not have ({leaf}).")
    created = _field(chat, "created", float, where, optional=True)
    updated = _field(chat, "updated", float, where, optional=True)
    return {
        "title": title,
        "system_prompt": _field(chat, "system_prompt", str, where, optional=True) or "",
        "messages": nodes,
        "current_leaf": leaf,
        "created": None if created is None else float(created),
        "updated": None if updated is None else float(updated),
        "settings": _field(chat, "settings", dict, where, optional=True) or {},
    }


def _attachments(m: dict[str, Any], at: str) -> str | None:
    """A message's attached files, checked, as the store keeps them."""
    listed = _field(m, "attachments", list, at, optional=True)
    if not listed:
        return None
    try:
        return attachments_to_json([Attachment.from_dict(a) for a in listed])
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BackupError(f"{at} has an attached file that cannot be read ({exc!r}).") from exc


def _documents(m: dict[str, Any], at: str) -> str | None:
    """What of a message's files the model was given, checked, as the store keeps it."""
    documents = _field(m, "documents", dict, at, optional=True)
    if documents is None:
        return None
    sources = ReplySources.from_json(json.dumps(documents))
    if sources is None:
        raise BackupError(f"{at} has no valid “documents” (the text and passages its files were read as).")
    return sources.to_json()


def _field(obj: dict[str, Any], name: str, kind: type, where: str, optional: bool = False) -> Any:
    """``obj[name]`` if it is a ``kind`` (a float may be written as an integer; a bool is no number)."""
    value = obj.get(name)
    if value is None and optional:
        return None
    kinds: tuple[type, ...] = (int, float) if kind is float else (kind,)
    if not isinstance(value, kinds) or (isinstance(value, bool) and kind is not bool):
        raise BackupError(f"{where} has no valid “{name}” ({_KIND_NAMES[kind]} expected).")
    return value


def export_markdown(conversation: Conversation, messages: Iterable[StoredMessage]) -> str:
    """A conversation as a Markdown document (File → Export chat…)."""
    from .stats import ReplyStats  # local: keeps this module importable on its own

    out = [f"# {conversation.title}", ""]
    if conversation.system_prompt.strip():
        out += ["> **System:** " + conversation.system_prompt.strip().replace("\n", "\n> "), ""]
    for m in messages:
        attachments = m.attachments
        out += [f"## {m.role.capitalize()}", ""]
        if m.content.strip() or not attachments:  # a message that is only files has no text to show
            out += [m.content.rstrip(), ""]
        if attachments:  # by name: the files' text is what the model read, not what was said
            out += ["Attached files:", "", *(f"- {a.name}" for a in attachments), ""]
        stats = ReplyStats.from_stats_json(m.stats_json)
        if stats is not None:
            out += [f"*{stats.summary_line()}*", ""]
    return "\n".join(out).rstrip() + "\n"
