"""OpenAI-shaped request bodies to the engine's settings, checked field by field.

Every refusal is an ``ApiError`` that names the field, so a client learns what to change; nothing the engine
cannot honour is ignored in silence (``n`` > 1, log probabilities, tools, images, logit bias, penalties other
than the repeat penalty).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from engine.decoding.settings import (
    DEFAULT_LOOKAHEAD,
    MAX_DRY_BASE,
    MAX_DRY_MULTIPLIER,
    MAX_GUESSES,
    MAX_NGRAM,
    MAX_NGRAM_REPEAT,
    MAX_WINDOW,
    LookaheadConfig,
    SamplingConfig,
    StopConfig,
)
from engine.decoding.text import Message
from engine.llama.problems import SettingsError

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, code: str, param: str | None = None,
                 kind: str = "invalid_request_error", headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.kind = kind
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, f"{param}: {message}", code, param)


@dataclass(frozen=True)
class CompletionRequest:
    """What a client asked for, in the engine's terms. ``messages`` for a chat, ``prompt`` for a raw completion."""

    model: str
    messages: tuple[Message, ...] | None
    prompt: str | None
    sampling: SamplingConfig
    stop: tuple[str, ...]
    max_tokens: int | None  # None: until the model ends its reply or the context is full
    lookahead: LookaheadConfig | None  # None: plain decoding
    lookahead_asked: str  # "auto" | "off" | "fixed"
    stream: bool
    include_usage: bool
    loop_guard: bool = False  # off unless asked: clients expect the text to run to a stop, the end or the limit

    def stop_config(self, room: int) -> StopConfig:
        """The engine's stop settings with ``room`` tokens left in the context."""
        limit = room if self.max_tokens is None else min(self.max_tokens, room)
        return StopConfig(max_tokens=max(limit, 1), stop_strings=self.stop, loop_guard=self.loop_guard)


# Fields that ask for what the engine does not do. A value equal to the harmless default is let through
# (clients send them filled in); anything else is refused by name.
_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1, None),
    "logprobs": (False, None),
    "top_logprobs": (0, None),
    "best_of": (1, None),
    "echo": (False, None),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "functions": (None, []),
    "function_call": (None, "none", "auto"),
    "logit_bias": (None, {}),
    "frequency_penalty": (0, 0.0, None),
    "presence_penalty": (0, 0.0, None),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
}


def parse_chat(body: Any, served_model: str, default_lookahead: str = "auto") -> CompletionRequest:
    """A ``/v1/chat/completions`` body."""
    body = _object(body)
    raw = body.get("messages")
    if raw is None:
        raise bad("messages", "is required", "missing_field")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty array of messages")
    messages = tuple(_message(m, i) for i, m in enumerate(raw))
    if messages[-1].role != "user":
        raise bad(f"messages[{len(messages) - 1}]", "the last message must be the user's")
    return _common(body, served_model, default_lookahead, messages=messages, prompt=None,
                   max_tokens=_first_present(body, "max_completion_tokens", "max_tokens"))


def parse_completion(body: Any, served_model: str, default_lookahead: str = "auto") -> CompletionRequest:
    """A ``/v1/completions`` body: one prompt string (or an array holding one)."""
    body = _object(body)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad("prompt", "is required", "missing_field")
    if isinstance(prompt, list):
        if len(prompt) != 1 or not isinstance(prompt[0], str):
            raise bad("prompt", "must be a string (one prompt per request)")
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise bad("prompt", "must be a string")
    if not prompt:
        raise bad("prompt", "is empty")
    return _common(body, served_model, default_lookahead, messages=None, prompt=prompt,
                   max_tokens=_first_present(body, "max_tokens"))


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    return body


def _first_present(body: dict[str, Any], *names: str) -> tuple[str, Any]:
    for name in names:
        if body.get(name) is not None:
            return name, body[name]
    return names[0], None


def _message(raw: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(raw, dict):
        raise bad(where, "must be an object with role and content")
    role = raw.get("role")
    if role not in ROLES:
        raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)} (tool messages are not supported)")
    for name in ("tool_calls", "function_call", "audio"):
        if raw.get(name):
            raise bad(f"{where}.{name}", "is not supported by this server", "unsupported_parameter")
    content = raw.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise bad(f"{where}.content[{j}]", f"only text parts are supported, not {kind!r}",
                          "unsupported_parameter")
            texts.append(part["text"])
        text = "".join(texts)
    elif content is None and role == "assistant":
        text = ""
    else:
        raise bad(f"{where}.content", "must be a string or an array of text parts")
    return Message("system" if role == "developer" else role, text)


def _common(body: dict[str, Any], served_model: str, default_lookahead: str, *,
            messages: tuple[Message, ...] | None, prompt: str | None, max_tokens: tuple[str, Any]) -> CompletionRequest:
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "must be a string")
    if model and model != served_model:
        raise ApiError(404, f"model: {model!r} is not served here; this server serves {served_model!r}",
                       "model_not_found", "model", kind="not_found_error")
    for name, harmless in _UNSUPPORTED.items():
        if name in body and body[name] not in harmless:
            raise bad(name, f"{body[name]!r} is not supported by this server", "unsupported_parameter")
    fmt = body.get("response_format")
    if fmt is not None and fmt != {"type": "text"}:
        raise bad("response_format", "only {\"type\": \"text\"} is supported", "unsupported_parameter")

    d = SamplingConfig()
    temperature = _number(body, "temperature", 0.0, 0.0, 2.0)
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**32)  # no seed asked for: each sampled request draws its own, as OpenAI's do
    else:
        seed = _integer(body, "seed", 0, 0, 2**32 - 1)
    try:
        sampling = SamplingConfig(
            temperature=temperature,
            top_k=_integer(body, "top_k", d.top_k, 0, 1000),
            top_p=_number(body, "top_p", d.top_p, 0.0, 1.0, low_open=True),
            min_p=_number(body, "min_p", d.min_p, 0.0, 1.0, high_open=True),
            seed=seed,
            repeat_penalty=_number(body, "repeat_penalty", d.repeat_penalty, 1.0, 2.0),
            repeat_last_n=_integer(body, "repeat_last_n", d.repeat_last_n, 0, 4096),
            dry_multiplier=_number(body, "dry_multiplier", d.dry_multiplier, 0.0, MAX_DRY_MULTIPLIER),
            dry_base=_number(body, "dry_base", d.dry_base, 1.0, MAX_DRY_BASE, low_open=True),
            dry_allowed_length=_integer(body, "dry_allowed_length", d.dry_allowed_length, 1, MAX_NGRAM_REPEAT),
        ).validate()
    except SettingsError as exc:  # the ranges above are the engine's: this is a safety net
        raise bad("sampling", str(exc)) from None

    name, value = max_tokens
    limit = None
    if value is not None:
        limit = _integer({name: value}, name, 0, 1, 1 << 30)
    lookahead, asked = _lookahead(body.get("lookahead", default_lookahead))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "must be true or false")
    loop_guard = body.get("loop_guard", False)
    if not isinstance(loop_guard, bool):
        raise bad("loop_guard", "must be true or false")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict):
            raise bad("stream_options", "must be an object")
        if not stream:
            raise bad("stream_options", "is only allowed with stream: true")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad("stream_options.include_usage", "must be true or false")
    return CompletionRequest(
        model=served_model, messages=messages, prompt=prompt, sampling=sampling, stop=_stop(body.get("stop")),
        max_tokens=limit, lookahead=lookahead, lookahead_asked=asked, stream=stream, include_usage=include_usage,
        loop_guard=loop_guard,
    )


def _number(body: dict[str, Any], name: str, default: float, low: float, high: float,
            low_open: bool = False, high_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(name, "must be a number")
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        lo, hi = ("(" if low_open else "[") + f"{low:g}", f"{high:g}" + (")" if high_open else "]")
        raise bad(name, f"{value!r} is out of range {lo}, {hi}")
    return float(value)


def _integer(body: dict[str, Any], name: str, default: int, low: int, high: int) -> int:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(name, "must be an integer")
    if not low <= value <= high:
        raise bad(name, f"{value} is out of range {low}..{high}")
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(s, str) for s in items):
        raise bad("stop", "must be a string or an array of strings")
    if len(items) > MAX_STOP_STRINGS:
        raise bad("stop", f"at most {MAX_STOP_STRINGS} stop strings")
    if any(not s or len(s) > MAX_STOP_LENGTH for s in items):
        raise bad("stop", f"each stop string must be 1..{MAX_STOP_LENGTH} characters")
    return tuple(items)


def _lookahead(value: Any) -> tuple[LookaheadConfig | None, str]:
    """``"auto"`` (default), ``"off"``, or ``{"window": W, "ngram": N, "guesses": G}``."""
    if value == "auto":
        return DEFAULT_LOOKAHEAD, "auto"
    if value == "off":
        return None, "off"
    if not isinstance(value, dict):
        raise bad("lookahead", 'must be "auto", "off" or an object {"window", "ngram", "guesses"}')
    unknown = set(value) - {"window", "ngram", "guesses"}
    if unknown:
        raise bad(f"lookahead.{sorted(unknown)[0]}", "is not a lookahead setting (window, ngram, guesses)")
    base = LookaheadConfig()
    try:
        cfg = LookaheadConfig(
            window=_integer(value, "window", base.window, 0, MAX_WINDOW),
            ngram=_integer(value, "ngram", base.ngram, 2, MAX_NGRAM),
            guesses=_integer(value, "guesses", base.guesses, 0, MAX_GUESSES),
        )
    except ApiError as exc:
        raise bad(f"lookahead.{exc.param}", exc.message.partition(": ")[2]) from None
    return cfg, "fixed"
