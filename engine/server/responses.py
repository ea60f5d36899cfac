"""A generation's step events folded into OpenAI's response objects: whole, or as a stream's chunks, with the
usage and llama-server's timings plus what lookahead did, and the tool calls the reply makes.

A streamed reply that may call tools holds its text back while it may still be the start of a call: a call's
markup is never sent as text, and its arguments go out whole, once, when the reply has ended (they parse).
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from engine.decoding.generation import StepEvent
from engine.decoding.text import ToolCall
from engine.server.requests import CompletionRequest
from engine.server.tools import may_be_calls, parse_calls
from engine.speed.run_stats import RunStats

# A reply the loop guard ended stopped for a reason of its own choosing, as one ended by a stop string did.
FINISH_REASONS = {"eog": "stop", "stop_string": "stop", "max_tokens": "length", "context_full": "length",
                  "cancelled": "stop", "loop": "stop"}


class Reply:
    """One generation's events folded into OpenAI's response objects."""

    def __init__(self, request: CompletionRequest, chat: bool, model_id: str) -> None:
        self.request = request
        self.chat = chat
        self.model_id = model_id
        self.stats = RunStats()
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        use = request.tool_use
        self._may_call = chat and use is not None and use.calls_allowed
        self._held: str | None = "" if self._may_call else None  # streamed text held back (None: none is)
        self._parsed: tuple[str | None, list[ToolCall]] | None = None

    def observe(self, event: StepEvent) -> None:
        self.stats.observe(event)

    @property
    def finish_reason(self) -> str:
        if self.stats.stop_reason in ("eog", "stop_string") and self._calls():
            return "tool_calls"
        return FINISH_REASONS.get(self.stats.stop_reason or "", "stop")

    def _split(self) -> tuple[str | None, list[ToolCall]]:
        """The reply's text and tool calls, read once the reply has ended."""
        if not self._may_call or self.stats.stop_reason is None:
            return self.stats.text, []
        if self._parsed is None:
            self._parsed = parse_calls(self.stats.text)
        return self._parsed

    def _calls(self) -> list[ToolCall]:
        return self._split()[1]

    def tool_calls(self) -> list[dict[str, Any]]:
        """The calls the reply makes, in OpenAI's shape (none until it has ended)."""
        return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in self._calls()]

    def usage(self) -> dict[str, int]:
        s = self.stats
        return {"prompt_tokens": s.prompt_tokens, "completion_tokens": s.n_tokens,
                "total_tokens": s.prompt_tokens + s.n_tokens}

    def timings(self) -> dict[str, Any]:
        """llama-server's timing names, and what lookahead did."""
        s = self.stats
        prompt_n = s.prompt_tokens - s.prompt_cached_tokens
        return {
            "cache_n": s.prompt_cached_tokens,
            "prompt_n": prompt_n,
            "prompt_ms": round(s.prefill_s * 1000, 3),
            # the prompt's last token is read by the first step (its time is in predicted_ms)
            "prompt_per_second": round(s.prefill_tokens / s.prefill_s, 2) if s.prefill_tokens else 0.0,
            "predicted_n": s.n_tokens,
            "predicted_ms": round(s.decode_s * 1000, 3),
            "predicted_per_second": round(s.n_tokens / s.decode_s, 2) if s.decode_s > 0 else 0.0,
            "draft_n": s.n_drafted,
            "draft_n_accepted": s.n_accepted,
            "forward_passes": s.steps,
            "tokens_per_step": round(s.tokens_per_step, 3),
            "lookahead": self.request.lookahead_asked,
        }

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model_id}

    def whole(self) -> dict[str, Any]:
        text, calls = self._split()
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if calls:
                message["tool_calls"] = self.tool_calls()
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": self.finish_reason}
            head = self._head("chat.completion")
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": self.finish_reason}
            head = self._head("text_completion")
        return {**head, "choices": [choice], "usage": self.usage(), "timings": self.timings()}

    def chunk(self, text: str = "", role: bool = False, finish: bool = False,
              tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        reason = self.finish_reason if finish else None
        if self.chat:
            delta: dict[str, Any] = {"content": text} if text else {}
            if role:
                delta = {"role": "assistant", "content": ""}
            if tool_calls:
                delta = {"tool_calls": tool_calls}
            out = {**self._head("chat.completion.chunk"),
                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}]}
        else:
            out = {**self._head("text_completion"),
                   "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason}]}
        if finish:
            out["timings"] = self.timings()
        if self.request.include_usage:
            out["usage"] = None
        return out

    def text_chunks(self, text: str) -> list[dict[str, Any]]:
        """The chunks to send for ``text`` just generated: none while it may be the start of a tool call."""
        if self._held is None:
            return [self.chunk(text=text)] if text else []
        self._held += text
        if may_be_calls(self._held):
            return []
        held, self._held = self._held, None
        return [self.chunk(text=held)]

    def closing_chunks(self) -> list[dict[str, Any]]:
        """What a stream sends when the reply has ended, before the finish chunk: the text held back, or the
        tool calls it turned out to be, each with its whole arguments."""
        if self._held is None:
            return []
        self._held = None
        text, calls = self._split()
        if not calls:
            return [self.chunk(text=text)] if text else []
        return [self.chunk(tool_calls=[{"index": k, **call} for k, call in enumerate(self.tool_calls())])]

    def usage_chunk(self) -> dict[str, Any]:
        """The last chunk with ``stream_options.include_usage``: no choices, the usage and timings."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": self.usage(), "timings": self.timings()}
