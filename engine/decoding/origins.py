"""Where a draft comes from, in two senses.

``DraftSource`` is the kind of lookup that found a draft: Auto keeps its acceptance statistics by it.
``DraftOrigin`` is where the draft's tokens came from: a reply counts its accepted tokens by it, the app tints
the text by it, and the kept n-grams are chosen by it. A token the model chose itself, not a draft's, is
``OWN``. Both are strings, so a value read back from a saved chat or a JSON report compares equal.
"""

from __future__ import annotations

from engine.units import Word


class DraftSource(Word):
    """The lookup that found a draft."""

    HISTORY = "history"  # a suffix match in this reply's text and what came before it
    DOCUMENT = "document"  # a suffix match in the attached documents
    CORPUS = "corpus"  # a suffix match in earlier chats
    POOL = "pool"  # an n-gram keyed by the last token alone, from this reply's pool
    KEPT = "kept"  # the same from the n-grams kept from earlier replies
    OPENING = "opening"  # either pool's, drafted by the step that reads the prompt's last token
    REPLAY = "replay"  # the bench's replay of a known reply (engine.decoding.replay)
    GRAMMAR = "grammar"  # the text a grammar forces next
    TEXT = "text"  # a match of the history's text where its tokens differ (text_match.py)


class DraftOrigin(Word):
    """Where a draft's tokens came from."""

    PROMPT = "prompt"  # the conversation being answered
    HISTORY = "history"  # turns left out of the context, the text being regenerated
    REPLY = "reply"  # this reply so far
    DOCUMENT = "document"  # the chat's attached documents, whole
    OTHER_CHATS = "other_chats"  # earlier chats with this model
    WINDOW = "window"  # the Jacobi window's trajectories
    KEPT = "kept"  # n-grams kept from earlier replies
    REPLAY = "replay"  # the bench's replay of a known reply
    GRAMMAR = "grammar"  # forced by the reply's grammar (a schema's keys and punctuation)
    UNKNOWN = "unknown"  # a draft that landed without a recorded origin


OWN = "own"  # a token the model chose itself (StepEvent.token_sources' other value)
