"""Constrained decoding: a grammar every token of the reply must follow (a JSON Schema, GBNF, or any JSON).

The grammar is llguidance's (the library behind guidance and llama.cpp's ``--llguidance``): it takes JSON
Schema and GBNF alike, works out the tokens a state allows fast enough to do at every emitted position, and
says which tokens the grammar forces next. ``GrammarState`` follows one reply:

- ``TokenDrawer`` masks every position's logits to the tokens the state allows before drawing, and commits
  the drawn token. Every emitted position is drawn once, in order, whatever the decoder, so the state only
  ever advances by committed tokens, never by a rejected draft: lookahead's text is plain decoding's.
- ``forced()`` is the text the grammar leaves no choice about (a schema's keys, quotes, commas and braces,
  the rest of an enum value once its first token is chosen), as the tokens llguidance splits it into. The
  state allows that split only, so each of those positions has one allowed token (``given()``): it is
  drafted as sure to land, and the row that predicts it needs no logits (plan.build_step).
- ``keep()`` cuts other drafts at their first token the grammar forbids.

A JSON Schema is compiled to one line of JSON with ``, `` and ``: `` between items: no whitespace is left
to the model, so more of the reply is forced and every reply reads the same way.
"""

from __future__ import annotations

import json
import warnings
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import llguidance
import numpy as np
from llguidance.llamacpp import lltokenizer_from_vocab

from engine.decoding.closing import MAX_CLOSE, Closer
from engine.llama.native import Model
from engine.llama.problems import SettingsError

if TYPE_CHECKING:
    from llguidance._lib import JsonCompileOptions  # in the stubs only

# How the JSON a schema asks for is laid out (see the module's docstring).
JSON_LAYOUT: JsonCompileOptions = {
    "whitespace_flexible": False, "item_separator": ", ", "key_separator": ": ",
}
MAX_GRAMMAR_CHARS = 200_000
# Tokens to spare when closing a reply before its limit: one token can open more than one level to close.
CLOSE_MARGIN = 4
# Punctuation that ends a clause where whitespace (or the draft's end) follows it: where a value copied from the
# prompt usually ends (``Fischer, lena`` -> ``"Fischer", "email": ...``).
CLAUSE_ENDS = frozenset(b",.;:!?)]}'\"")

_TOKENIZERS: weakref.WeakKeyDictionary[Model, llguidance.LLTokenizer] = weakref.WeakKeyDictionary()


class GrammarError(SettingsError):
    """A grammar or schema that cannot be used: the message says why."""


@dataclass(frozen=True)
class Constraint:
    """What a reply must follow, as the caller gave it.

    ``kind``: "json_schema" (``text`` is the schema as JSON), "json" (any JSON object; ``text`` unused),
    "gbnf" (``text`` is a grammar in llama.cpp's GBNF, or in Lark) or "lark" (llguidance's Lark, which can
    hold JSON schemas: the tool calls' grammar).
    """

    kind: str
    text: str = ""

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> Constraint:
        return cls("json_schema", json.dumps(schema))

    def describe(self) -> str:
        kinds = {"json_schema": "JSON schema", "json": "JSON object format", "gbnf": "grammar", "lark": "grammar"}
        return kinds.get(self.kind, self.kind)

    def grammar(self) -> str:
        """llguidance's grammar for this constraint; GrammarError if it cannot be made."""
        if len(self.text) > MAX_GRAMMAR_CHARS:
            raise GrammarError(f"the grammar is {len(self.text)} characters long; at most {MAX_GRAMMAR_CHARS}")
        try:
            if self.kind == "json":
                return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)
            if self.kind == "json_schema":
                return llguidance.LLMatcher.grammar_from_json_schema(self.text, defaults=JSON_LAYOUT)
            if self.kind == "gbnf":
                return llguidance.grammar_from("gbnf", self.text)
            if self.kind == "lark":
                return llguidance.LLMatcher.grammar_from_lark(self.text)
        except ValueError as exc:
            raise GrammarError(f"the {self.describe()} cannot be used: {exc}") from None
        raise GrammarError(f"unknown kind of constraint: {self.kind}")


def tokenizer_of(model: Model) -> llguidance.LLTokenizer:
    """llguidance's view of ``model``'s vocabulary, made once per model (it reads every token's text)."""
    found = _TOKENIZERS.get(model)
    if found is None:
        ends = sorted({t for t in (model.eos(), model.eot()) if t >= 0})
        with warnings.catch_warnings():  # it reads token attributes by a name the bindings call deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            found = _TOKENIZERS[model] = lltokenizer_from_vocab(model.vocab, eos_token=ends)
    return found


class GrammarState:
    """Where one reply stands in its grammar: what each position allows, and what the grammar forces next.

    With ``max_tokens``, a reply about to run out of tokens is closed in time: once the way to a whole sentence
    of the grammar that ``closing.Closer`` finds takes the tokens left, each position allows only that way's next
    token (drafted as forced text), so a JSON reply cut by its limit still parses (``wrapped`` says it was).
    """

    def __init__(self, model: Model, constraint: Constraint, max_tokens: int | None = None) -> None:
        grammar = constraint.grammar()
        self._matcher = llguidance.LLMatcher(tokenizer_of(model), grammar, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(f"the {constraint.describe()} cannot be used: {self._matcher.get_error()}")
        self._n_vocab = model.n_vocab
        self._piece = model.token_bytes
        self._tokenize = model.text_tokens
        quote = self._tokenize('"')
        self._quote = quote[0] if len(quote) == 1 else None
        self._closer = Closer(model) if max_tokens is not None else None
        self._is_end = model.is_eog
        self._left = max_tokens if max_tokens is not None else 0
        # The tokens the grammar gives from the next position on, each the only one it allows there: what it
        # forces, in its own tokens, or the way to its end once the closing has taken it (see ``_given``).
        self._run: list[int] = []
        self._looked: int | None = None  # the tokens left when the run was last looked for
        self._likely: tuple[int, ...] = ()  # what ``likely`` answers, worked out once per position
        self._likely_at: int | None = None
        self.wrapped = False

    def allows(self, token: int) -> bool:
        run = self._given()
        if run:
            return token == run[0]
        return self._matcher.validate_tokens([token]) == 1

    def mask(self, row: np.ndarray) -> None:
        """Lower every token the grammar does not allow here to -inf, in place."""
        run = self._given()
        if run:
            keep = row[run[0]]
            row[:] = -np.inf
            row[run[0]] = keep if np.isfinite(keep) else 0.0
            return
        bits = np.unpackbits(np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = bits[: self._n_vocab].astype(bool)
        row[: len(allowed)][~allowed] = -np.inf
        row[len(allowed) :] = -np.inf

    def given(self) -> int | None:
        """The only token the grammar allows at the next position, if there is one: it needs no logits."""
        run = self._given()
        return run[0] if run else None

    def commit(self, token: int) -> None:
        """The token drawn at the next position (one the mask allowed)."""
        if not self._matcher.consume_token(token):
            raise RuntimeError(f"the grammar refused a token it allowed: {self._matcher.get_error()}")
        self._left -= 1
        if self._run:
            self._run.pop(0)

    def _given(self) -> list[int]:
        """The run of tokens the grammar gives from the next position on, looked for once per position.

        Forced text is given in the tokens llguidance splits it into, not in any other split of the same
        bytes: the text is the same, and a position with one allowed token is one the model need not be asked
        about (plain and lookahead decoding alike, so their text stays the same).
        """
        if self._run or self._looked == self._left or self._matcher.is_stopped():
            return self._run
        self._looked = self._left
        if not self._closes():
            self._run = list(self._matcher.compute_ff_tokens())
        return self._run

    def _closes(self) -> bool:
        """Whether the tokens left force the way to the grammar's end from here (see the class); taken as the
        run of given tokens when they do."""
        if self._closer is None or self._left > MAX_CLOSE:
            return False
        way = self._closer.way_to_end(self._matcher)
        # Not yet, or never: [end] alone ends it as it likes, and a way longer than the tokens left cannot help.
        if way is None or len(way) <= 1 or not self._left - CLOSE_MARGIN <= len(way) <= self._left:
            return False
        self._run, self.wrapped = way, True
        return True

    def forced(self, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` tokens the grammar forces next (none when it leaves a choice)."""
        return tuple(self._given()[:limit]) if limit > 0 else ()

    def likely(self, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` tokens of the text the grammar forces past its given run, split as that text alone
        splits. A guess, not given: the model may write the text's end merged with what follows it (``' "'`` and
        ``'S'``, or ``' "S'``), which is why llguidance's own tokens for it stop short."""
        if limit <= 0 or self.wrapped:
            return ()
        if self._likely_at != self._left:
            self._likely_at, self._likely = self._left, self._past_run()
        return self._likely[:limit]

    def _past_run(self) -> tuple[int, ...]:
        run, matcher = self._given(), self._matcher
        if matcher.is_stopped():
            return ()
        taken = matcher.try_consume_tokens(run)
        try:
            if taken != len(run):
                return ()
            text = matcher.compute_ff_bytes().decode("utf-8", "ignore")  # a character cut at the end is left out
            tokens = self._tokenize(text) if text else []
            return tuple(tokens[: matcher.validate_tokens(tokens)])
        finally:
            matcher.rollback(taken)

    def keep(self, tokens: tuple[int, ...]) -> int:
        """How many of ``tokens``, from the next position on, the grammar allows."""
        run = self._given()
        same = next((i for i, (a, b) in enumerate(zip(tokens, run, strict=False)) if a != b),
                    min(len(tokens), len(run)))
        if same < len(run) or same == len(tokens) or self.wrapped:
            return same
        matcher = self._matcher  # past the given run, the grammar's own rule
        if not same:
            return int(matcher.validate_tokens(list(tokens)))
        taken = matcher.try_consume_tokens(list(tokens[:same]))
        try:
            return taken + int(matcher.validate_tokens(list(tokens[same:]))) if taken == same else taken
        finally:
            matcher.rollback(taken)

    def ending(self, tokens: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
        """Where ``tokens`` (a draft of text copied from elsewhere, all allowed from the next position on) end a
        clause, and what ends the string being written there: the index of the token that starts the clause's
        end, and the quote with the text the grammar forces after it (``", "email": "``). None where the text
        ends no clause or the grammar has no string to end there."""
        at = self._clause_end(tokens)
        if at is None or self._quote is None or self._given():
            return None
        matcher = self._matcher
        taken = matcher.try_consume_tokens(list(tokens[:at]))
        try:
            if taken != at or matcher.validate_tokens([self._quote]) != 1:
                return None
            matcher.consume_token(self._quote)
            forced = matcher.compute_ff_tokens()
            matcher.rollback(1)
            closing = self._tokenize('"' + b"".join(self._piece(t) for t in forced).decode("utf-8", "replace"))
            kept = closing[: matcher.validate_tokens(closing)]
            return (at, tuple(kept)) if kept else None
        finally:
            matcher.rollback(taken)

    def _clause_end(self, tokens: tuple[int, ...]) -> int | None:
        """The first token of ``tokens`` whose text starts with punctuation that whitespace or the draft's end
        follows (None if none does)."""
        text = [self._piece(t) for t in tokens]
        for i, piece in enumerate(text):
            if not piece or piece[0] not in CLAUSE_ENDS:
                continue
            rest = b"".join(text[i:]).lstrip(bytes(CLAUSE_ENDS))
            if not rest or rest[:1].isspace():
                return i
        return None

    def close_now(self, unkept: int, limit: int) -> list[int]:
        """The way to the grammar's end from a reply stopped short of it (a loop stopped), so that its text
        still parses as a reply closed at its token limit does: the last ``unkept`` committed tokens, past the
        reply's end, taken back first. Empty where no way of at most ``limit`` tokens is found (or none is
        needed); the end-of-text token is left out, the reply ending all the same."""
        if self._closer is None or (unkept and not self._matcher.rollback(unkept)):
            return []
        way = [t for t in self._closer.way_to_end(self._matcher) or [] if not self._is_end(t)]
        if not way or len(way) > limit or self._matcher.try_consume_tokens(way) != len(way):
            return []
        self._left += unkept - len(way)
        self._run, self._looked, self.wrapped = [], None, True
        return way

    @property
    def complete(self) -> bool:
        """Whether the text so far is a whole sentence of the grammar."""
        return bool(self._matcher.is_accepting())


def follows(model: Model, constraint: Constraint, tokens: list[int]) -> bool:
    """Whether ``tokens`` (a reply; an end-of-text token ends it) are a whole sentence of ``constraint``'s
    grammar, however its text is split into tokens: for a schema, JSON that parses and follows it."""
    matcher = llguidance.LLMatcher(tokenizer_of(model), constraint.grammar(), log_level=0)
    for tok in tokens:
        if model.is_eog(tok):
            break
        if not matcher.consume_token(tok):
            return False
    return bool(matcher.is_accepting())
