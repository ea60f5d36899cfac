"""OpenAI-shaped request bodies to the engine's settings, checked field by field.

Every refusal is an ``ApiError`` that names the field, so a client learns what to change; nothing the engine
cannot honour is ignored in silence (``n`` > 1, log probabilities, images, logit bias, penalties other than the
repeat penalty). Tools and structured output (``response_format``, llama-server's ``grammar`` and
``json_schema``) are taken; whether the loaded model can take tools is known only where it runs (jobs.py).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from engine.decoding.grammar import Constraint
from engine.decoding.settings import (
    DEFAULT_LOOKAHEAD,
    MAX_GUESSES,
    MAX_NGRAM,
    MAX_WINDOW,
    SAMPLING_RANGES,
    LookaheadConfig,
    SamplingConfig,
    SettingRange,
    StopConfig,
)
from engine.decoding.text import Message, ToolCall
from engine.llama.problems import SettingsError
from engine.server.tools import MAX_TOOLS, NAME, ToolUse

MAX_STOP_STRINGS = 16
MAX_STOP_LENGTH = 256
ROLES = ("system", "developer", "user", "assistant", "tool")


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


def internal_error() -> ApiError:
    """What a client hears of a fault of ours: never the exception's text, which may hold anything."""
    return ApiError(500, "the server failed to answer this request", "internal_error", kind="server_error")


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
    tool_use: ToolUse | None = None  # the tools offered, if any
    constraint: Constraint | None = None  # structured output asked for (response_format, grammar, json_schema)

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
    called: set[str] = set()
    for i, m in enumerate(messages):
        called |= {c.id for c in m.tool_calls}
        if m.role == "tool" and m.tool_call_id not in called:
            raise bad(f"messages[{i}].tool_call_id", "answers no tool call of an earlier assistant message")
    if messages[-1].role not in ("user", "tool"):
        raise bad(f"messages[{len(messages) - 1}]", "the last message must be the user's or a tool's")
    req = _common(body, served_model, default_lookahead, messages=messages, prompt=None,
                  max_tokens=_first_present(body, "max_completion_tokens", "max_tokens"))
    tool_use = _tool_use(body)
    if tool_use is not None and tool_use.calls_allowed and req.constraint is not None:
        raise bad("response_format", "cannot be combined with tools the model may call", "unsupported_parameter")
    return replace(req, tool_use=tool_use)


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
        raise bad(f"{where}.role", f"must be one of {', '.join(ROLES)}")
    for name in ("function_call", "audio"):
        if raw.get(name):
            raise bad(f"{where}.{name}", "is not supported by this server", "unsupported_parameter")
    calls = _tool_calls(raw.get("tool_calls"), where) if role == "assistant" else ()
    call_id = raw.get("tool_call_id")
    if role == "tool" and (not isinstance(call_id, str) or not call_id):
        raise bad(f"{where}.tool_call_id", "is required in a tool message", "missing_field")
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
    return Message("system" if role == "developer" else role, text, calls, str(call_id) if role == "tool" else "")


def _tool_calls(raw: Any, where: str) -> tuple[ToolCall, ...]:
    """An assistant message's ``tool_calls``: each a function's name and its arguments as JSON text."""
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise bad(f"{where}.tool_calls", "must be an array")
    calls = []
    for k, call in enumerate(raw):
        at = f"{where}.tool_calls[{k}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise bad(at, "must be {\"id\", \"type\": \"function\", \"function\": {\"name\", \"arguments\"}}")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            raise bad(f"{at}.function.arguments", "must be a string of JSON")
        call_id = call.get("id", "")
        if not isinstance(call_id, str):
            raise bad(f"{at}.id", "must be a string")
        calls.append(ToolCall(call_id, function["name"], arguments))
    return tuple(calls)


def _tool_use(body: dict[str, Any]) -> ToolUse | None:
    """``tools``, ``tool_choice`` and ``parallel_tool_calls``; None when no tools are offered."""
    raw, choice = body.get("tools"), body.get("tool_choice")
    if raw is None or raw == []:
        if choice not in (None, "none", "auto"):
            raise bad("tool_choice", "names a tool, but no tools are offered")
        return None
    if not isinstance(raw, list) or len(raw) > MAX_TOOLS:
        raise bad("tools", f"must be an array of at most {MAX_TOOLS} tools")
    tools = tuple(_tool(t, k) for k, t in enumerate(raw))
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise bad("tools", "two tools have the same name")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "must be true or false")
    if choice is None or choice in ("auto", "none", "required"):
        return ToolUse(tools, choice or "auto", parallel=parallel)
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise bad("tool_choice", 'must be "auto", "none", "required" or {"type": "function", "function": {"name"}}')
    if name not in names:
        raise bad("tool_choice", f"names {name!r}, which is not among the tools offered")
    return ToolUse(tools, "function", name, parallel)


def _tool(raw: Any, k: int) -> dict[str, Any]:
    at = f"tools[{k}]"
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(raw.get("function"), dict):
        raise bad(at, 'must be {"type": "function", "function": {"name", "description", "parameters"}}')
    function = raw["function"]
    if not isinstance(function.get("name"), str) or not NAME.match(function["name"]):
        raise bad(f"{at}.function.name", "must be 1 to 64 letters, digits, underscores or dashes")
    if not isinstance(function.get("description", ""), str):
        raise bad(f"{at}.function.description", "must be a string")
    parameters = function.get("parameters", {"type": "object"})
    if not isinstance(parameters, dict):
        raise bad(f"{at}.function.parameters", "must be a JSON schema object")
    try:
        Constraint.json_schema(parameters).grammar()
    except SettingsError as exc:
        raise bad(f"{at}.function.parameters", str(exc)) from None
    out = {"name": function["name"], "parameters": parameters}
    if function.get("description"):
        out["description"] = function["description"]
    return {"type": "function", "function": out}


def _constraint(body: dict[str, Any]) -> Constraint | None:
    """Structured output: OpenAI's ``response_format``, or llama-server's ``json_schema`` or ``grammar``."""
    fmt, schema, grammar = body.get("response_format"), body.get("json_schema"), body.get("grammar")
    asked = [name for name, value in (("response_format", fmt), ("json_schema", schema), ("grammar", grammar))
             if value is not None and value != {"type": "text"}]
    if len(asked) > 1:
        raise bad(asked[1], f"cannot be combined with {asked[0]}", "unsupported_parameter")
    try:
        if asked == ["response_format"]:
            return _response_format(fmt)
        if asked == ["json_schema"]:
            if not isinstance(schema, dict):
                raise bad("json_schema", "must be a JSON schema object")
            return _checked(Constraint.json_schema(schema))
        if asked == ["grammar"]:
            if not isinstance(grammar, str) or not grammar.strip():
                raise bad("grammar", "must be a grammar in GBNF")
            return _checked(Constraint("gbnf", grammar))
    except SettingsError as exc:
        raise bad(asked[0], str(exc)) from None
    return None


def _response_format(fmt: Any) -> Constraint:
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "json_object":
        return Constraint("json")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise bad("response_format.json_schema.schema", "must be a JSON schema object", "missing_field")
        return _checked(Constraint.json_schema(schema))
    raise bad("response_format", 'must be {"type": "text"}, {"type": "json_object"} or {"type": "json_schema", '
                                 '"json_schema": {"name", "schema"}}')


def _checked(constraint: Constraint) -> Constraint:
    constraint.grammar()  # GrammarError (a SettingsError) names what is wrong
    return constraint


def _common(body: dict[str, Any], served_model: str, default_lookahead: str, *,
            messages: tuple[Message, ...] | None, prompt: str | None, max_tokens: tuple[str, Any]) -> CompletionRequest:
    """The fields both OpenAI routes share, checked one after another: a flat list of checks, kept in one piece
    so that every field's rule is found in one place."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise bad("model", "must be a string")
    # Another name than the served model's is answered by the served model, as llama-server does: editors and
    # agents send the name they were set up with or their own default ("gpt-4o", "claude-…"), often one the
    # user cannot change, and there is one model here. The response's ``model`` says which answered.
    for name, harmless in _UNSUPPORTED.items():
        if name in body and body[name] not in harmless:
            raise bad(name, f"{body[name]!r} is not supported by this server", "unsupported_parameter")
    constraint = _constraint(body)

    d = SamplingConfig()
    temperature = _setting(body, "temperature", 0.0)
    seed = body.get("seed")
    if seed is None:
        seed = secrets.randbelow(2**32)  # no seed asked for: each sampled request draws its own, as OpenAI's do
    else:
        seed = _setting(body, "seed", 0)
    try:
        sampling = SamplingConfig(
            temperature=temperature,
            top_k=_setting(body, "top_k", d.top_k),
            top_p=_setting(body, "top_p", d.top_p),
            min_p=_setting(body, "min_p", d.min_p),
            seed=seed,
            repeat_penalty=_setting(body, "repeat_penalty", d.repeat_penalty),
            repeat_last_n=_setting(body, "repeat_last_n", d.repeat_last_n),
            dry_multiplier=_setting(body, "dry_multiplier", d.dry_multiplier),
            dry_base=_setting(body, "dry_base", d.dry_base),
            dry_allowed_length=_setting(body, "dry_allowed_length", d.dry_allowed_length),
        ).validate()
    except SettingsError as exc:  # the fields were checked against these very ranges: a safety net
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
        loop_guard=loop_guard, constraint=constraint,
    )


def _setting(body: dict[str, Any], name: str, default: float) -> Any:
    """A sampling field, in the engine's range for it (``SAMPLING_RANGES``): an integer where the default is one."""
    allowed = SAMPLING_RANGES[name]
    if isinstance(default, int):
        return _integer(body, name, default, int(allowed.low), int(allowed.high))
    return _number(body, name, default, allowed)


def _number(body: dict[str, Any], name: str, default: float, allowed: SettingRange) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(name, "must be a number")
    if value not in allowed:
        raise bad(name, f"{value!r} is out of range {allowed}")
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
