"""Anthropic's Messages API (``POST /v1/messages``) over the OpenAI chat path, translated as JSON.

A Messages body becomes the chat-completions body ``parse_chat`` reads, so both APIs share one set of checks,
limits and jobs; the finished ``Reply.whole()`` becomes Anthropic's message, and a stream's step events become
Anthropic's server-sent events. Every refusal on this route, whichever layer makes it, takes Anthropic's error
shape (``anthropic_errors``).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import web

from engine.decoding.generation import StepEvent
from engine.server.requests import ApiError, bad, internal_error
from engine.server.responses import Reply

log = logging.getLogger("engine.server")

ROUTE = "/v1/messages"

# Anthropic's fields taken as they are, by the chat body's name for them.
_RENAMED = {"model": "model", "max_tokens": "max_tokens", "stop_sequences": "stop", "temperature": "temperature",
            "top_p": "top_p", "top_k": "top_k", "stream": "stream"}
_TRANSLATED = ("system", "messages", "tools", "tool_choice")
# They change nothing in what a local model answers (its prompt cache works without being asked).
_IGNORED = ("metadata", "service_tier", "cache_control", "inference_geo", "speed")
# This server's own settings (see ``parse_chat``), which a client sends as extra body fields.
_EXTENSIONS = ("seed", "min_p", "repeat_penalty", "repeat_last_n", "dry_multiplier", "dry_base",
               "dry_allowed_length", "lookahead", "loop_guard")
_KNOWN = {*_RENAMED, *_TRANSLATED, *_IGNORED, *_EXTENSIONS}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and "tool", which names one


# -- request ----------------------------------------------------------------------------------------------------


def to_chat_body(body: Any) -> dict[str, Any]:
    """An Anthropic Messages body as the OpenAI chat-completions body ``parse_chat`` reads.

    Checks the shape only Anthropic's API has (blocks, tools, ``max_tokens`` required); values both APIs share
    (ranges, stop strings, the model's name) are left to ``parse_chat``. A field neither knows is refused by name.
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "invalid_json")
    unknown = sorted(set(body) - _KNOWN)
    if unknown:
        raise bad(unknown[0], "is not supported by this server", "unsupported_parameter")
    if body.get("max_tokens") is None:
        raise bad("max_tokens", "is required", "missing_field")
    chat = {name: body[field] for field, name in _RENAMED.items() if field in body}
    chat.update({name: body[name] for name in _EXTENSIONS if name in body})
    chat["messages"] = _system(body.get("system")) + _messages(body.get("messages"))
    if body.get("tools") is not None:
        chat["tools"] = _tools(body["tools"])
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice(body["tool_choice"]))
    return chat


def _system(value: Any) -> list[dict[str, Any]]:
    return [] if value is None else [{"role": "system", "content": _text(value, "system")}]


def _messages(raw: Any) -> list[dict[str, Any]]:
    if raw is None:
        raise bad("messages", "is required", "missing_field")
    if not isinstance(raw, list) or not raw:
        raise bad("messages", "must be a non-empty array of messages")
    return [out for i, message in enumerate(raw) for out in _message(message, f"messages[{i}]")]


def _message(raw: Any, where: str) -> list[dict[str, Any]]:
    """One Anthropic message as the chat messages it stands for (a user turn's tool results are messages of
    their own in OpenAI's terms)."""
    if not isinstance(raw, dict):
        raise bad(where, "must be an object with role and content")
    role = raw.get("role")
    if role not in ("user", "assistant"):
        raise bad(f"{where}.role", 'must be "user" or "assistant" (the system prompt is the top-level "system")')
    content = raw.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list):
        raise bad(f"{where}.content", "must be a string or an array of content blocks")
    blocks = [(f"{where}.content[{j}]", block) for j, block in enumerate(content)]
    return _assistant(blocks) if role == "assistant" else _user(blocks)


def _user(blocks: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Each tool result as a tool message, where it stands; the text around them as user messages."""
    out: list[dict[str, Any]] = []
    text: list[str] = []
    for where, block in blocks:
        if _block_type(block, where, ("text", "tool_result")) == "text":
            text.append(_text_of(block, where))
            continue
        if text:
            out.append({"role": "user", "content": "".join(text)})
            text = []
        out.append(_tool_result(block, where))
    if text or not out:
        out.append({"role": "user", "content": "".join(text)})
    return out


def _assistant(blocks: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """The text, and each tool use as one of the message's tool calls."""
    text: list[str] = []
    calls: list[dict[str, Any]] = []
    for where, block in blocks:
        if _block_type(block, where, ("text", "tool_use")) == "text":
            text.append(_text_of(block, where))
        else:
            calls.append(_tool_call(block, where))
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text) if text else None}
    if calls:
        message["tool_calls"] = calls
    return [message]


def _block_type(block: Any, where: str, allowed: tuple[str, ...]) -> str:
    kind = block.get("type") if isinstance(block, dict) else None
    if kind not in allowed:
        shown = repr(kind) if isinstance(kind, str) else "a block without a type"
        raise bad(f"{where}.type", f"{shown} is not taken here; this message's blocks may be "
                  + " or ".join(allowed), "unsupported_parameter")
    return kind


def _text(value: Any, where: str) -> str:
    """A string, or an array of text blocks joined (``cache_control`` and citations mean nothing here)."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise bad(where, "must be a string or an array of text blocks")
    parts = []
    for j, block in enumerate(value):
        _block_type(block, f"{where}[{j}]", ("text",))
        parts.append(_text_of(block, f"{where}[{j}]"))
    return "".join(parts)


def _text_of(block: dict[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{where}.text", "must be a string")
    return text


def _string(raw: dict[str, Any], name: str, where: str) -> str:
    value = raw.get(name)
    if not isinstance(value, str) or not value:
        raise bad(f"{where}.{name}", "must be a non-empty string")
    return value


def _tool_call(block: dict[str, Any], where: str) -> dict[str, Any]:
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise bad(f"{where}.input", "must be an object")
    return {"id": _string(block, "id", where), "type": "function",
            "function": {"name": _string(block, "name", where),
                         "arguments": json.dumps(arguments, ensure_ascii=False)}}


def _tool_result(block: dict[str, Any], where: str) -> dict[str, Any]:
    content = block.get("content")
    text = "" if content is None else _text(content, f"{where}.content")
    failed = block.get("is_error", False)
    if not isinstance(failed, bool):
        raise bad(f"{where}.is_error", "must be true or false")
    if failed:  # a tool message has no flag for it: the model reads it in the text
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": _string(block, "tool_use_id", where), "content": text}


def _tools(raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise bad("tools", "must be an array of tools")
    return [_tool(tool, f"tools[{i}]") for i, tool in enumerate(raw)]


def _tool(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad(where, "must be an object with name and input_schema")
    kind = raw.get("type", "custom")
    if kind != "custom":  # Anthropic's server tools (web search, code execution, ...) run on Anthropic's side
        raise bad(f"{where}.type", f"{kind!r}: only custom tools (name, description, input_schema) are supported",
                  "unsupported_parameter")
    schema = raw.get("input_schema")
    if not isinstance(schema, dict):
        raise bad(f"{where}.input_schema", "must be a JSON Schema object")
    function: dict[str, Any] = {"name": _string(raw, "name", where), "parameters": schema}
    description = raw.get("description")
    if description is not None:
        if not isinstance(description, str):
            raise bad(f"{where}.description", "must be a string")
        function["description"] = description
    return {"type": "function", "function": function}


def _tool_choice(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad("tool_choice", 'must be an object {"type": "auto" | "any" | "tool" | "none"}')
    kind = raw.get("type")
    if kind == "tool":
        choice: Any = {"type": "function", "function": {"name": _string(raw, "name", "tool_choice")}}
    elif kind in _TOOL_CHOICES:
        choice = _TOOL_CHOICES[kind]
    else:
        raise bad("tool_choice.type", 'must be "auto", "any", "tool" or "none"')
    out = {"tool_choice": choice}
    one_at_a_time = raw.get("disable_parallel_tool_use")
    if one_at_a_time is not None:
        if not isinstance(one_at_a_time, bool):
            raise bad("tool_choice.disable_parallel_tool_use", "must be true or false")
        out["parallel_tool_calls"] = not one_at_a_time
    return out


# -- response ---------------------------------------------------------------------------------------------------

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def stop_of(finish_reason: str, engine_reason: str | None, matched: str = "") -> tuple[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` of a reply that ended with OpenAI's ``finish_reason``,
    the engine's own reason (``RunStats.stop_reason``) and the stop string it matched (``RunStats.stop_string``).
    """
    if finish_reason == "tool_calls":
        return "tool_use", None
    if engine_reason == "stop_string":
        return "stop_sequence", matched or None
    if engine_reason == "context_full":
        return "model_context_window_exceeded", None
    return _STOP_REASONS.get(finish_reason, "end_turn"), None


def to_message(whole: dict[str, Any], message_id: str, engine_reason: str | None = None,
               matched: str = "") -> dict[str, Any]:
    """OpenAI's chat completion (``Reply.whole()``) as Anthropic's message."""
    choice = whole["choices"][0]
    stop_reason, stop_sequence = stop_of(choice["finish_reason"], engine_reason, matched)
    usage = whole["usage"]
    return {"id": message_id, "type": "message", "role": "assistant", "model": whole["model"],
            "content": _content(choice["message"]), "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"]}}


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    text = [{"type": "text", "text": message["content"]}] if message.get("content") else []
    return text + [_tool_use(call) for call in message.get("tool_calls") or ()]


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"] or "{}")
    except ValueError:
        arguments = None
    if not isinstance(arguments, dict):  # Anthropic's clients are promised an object: a reply without one failed
        raise ApiError(500, f"the tool call {function['name']!r} came without a JSON object of arguments",
                       "generation_failed", kind="server_error")
    return {"type": "tool_use", "id": call["id"], "name": function["name"], "input": arguments}


class MessageReply:
    """One generation's ``Reply`` as Anthropic's message: ``whole()``, or a stream's events (``step`` for each
    step event, after ``Reply.observe`` has taken it, then ``finish``, or ``error``).

    Text streams as OpenAI's stream sends it (``Reply.text_chunks``: held back while it may be the start of a
    tool call). Tool calls are known only once the reply is complete (in ``Reply.whole()``), so their blocks
    close the stream, each with its whole input in one ``input_json_delta``.
    """

    def __init__(self, reply: Reply) -> None:
        self.reply = reply
        self.id = "msg_" + uuid.uuid4().hex[:24]
        self._started = False
        self._blocks = 0  # content blocks opened so far; the last is at index _blocks - 1
        self._text_open = False

    def whole(self) -> dict[str, Any]:
        reply = self.reply
        return to_message(reply.whole(), self.id, reply.stats.stop_reason, reply.stats.stop_string)

    def step(self, event: StepEvent) -> list[dict[str, Any]]:
        out = self._start()
        for chunk in self.reply.text_chunks(event.text):
            out += self._text(chunk)
        return out

    def finish(self) -> list[dict[str, Any]]:
        out = self._start()
        for chunk in self.reply.closing_chunks():  # the text held back, if it was no tool call after all
            out += self._text(chunk)
        message = self.whole()
        if self._text_open:
            out.append(self._close())
        for block in message["content"]:
            if block["type"] == "tool_use":
                out += [self._open({**block, "input": {}}),
                        self._delta({"type": "input_json_delta",
                                     "partial_json": json.dumps(block["input"], ensure_ascii=False)}),
                        self._close()]
        out.append({"type": "message_delta",
                    "delta": {"stop_reason": message["stop_reason"], "stop_sequence": message["stop_sequence"]},
                    "usage": message["usage"]})
        out.append({"type": "message_stop"})
        return out

    @staticmethod
    def error(exc: ApiError) -> list[dict[str, Any]]:
        """A failure after the stream's status was sent: the error goes in the stream."""
        return [error_body(exc)]

    def _start(self) -> list[dict[str, Any]]:
        """``message_start`` before the first event (sent once the first step has counted the prompt)."""
        if self._started:
            return []
        self._started = True
        reply = self.reply
        message: dict[str, Any] = {"id": self.id, "type": "message", "role": "assistant", "model": reply.model_id,
                                   "content": [],
                   "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": reply.stats.prompt_tokens, "output_tokens": 0}}
        return [{"type": "message_start", "message": message}]

    def _text(self, chunk: dict[str, Any]) -> list[dict[str, Any]]:
        """The text of one of OpenAI's stream chunks as a text delta (a chunk's tool calls are taken from the
        whole reply instead, with their input parsed)."""
        text = chunk["choices"][0]["delta"].get("content")
        if not text:
            return []
        out = []
        if not self._text_open:
            out.append(self._open({"type": "text", "text": ""}))
            self._text_open = True
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def _open(self, block: dict[str, Any]) -> dict[str, Any]:
        self._blocks += 1
        return {"type": "content_block_start", "index": self._blocks - 1, "content_block": block}

    def _delta(self, delta: dict[str, Any]) -> dict[str, Any]:
        return {"type": "content_block_delta", "index": self._blocks - 1, "delta": delta}

    def _close(self) -> dict[str, Any]:
        self._text_open = False
        return {"type": "content_block_stop", "index": self._blocks - 1}


def sse(events: list[dict[str, Any]]) -> bytes:
    """Server-sent events as Anthropic sends them: each named (``event:``) by its type."""
    return b"".join(f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n".encode() for e in events)


# -- errors -----------------------------------------------------------------------------------------------------

_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
                413: "request_too_large", 429: "rate_limit_error"}


def error_body(exc: ApiError) -> dict[str, Any]:
    """Anthropic's error object for a refusal: its type follows the status, as Anthropic's clients read it."""
    if exc.status >= 500:
        kind = "overloaded_error" if exc.code == "queue_full" else "api_error"
    else:
        kind = _ERROR_TYPES.get(exc.status, "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": exc.message}}


@web.middleware
async def anthropic_errors(request: web.Request,
                           handler: Callable[[web.Request], Any]) -> web.StreamResponse:
    """Every refusal on Anthropic's route (the key, the Host, the body, the queue, the generation) in
    Anthropic's error shape; other routes' pass by for the server's own handler of OpenAI's shape."""
    if request.path != ROUTE and not request.path.startswith(ROUTE + "/"):
        return await handler(request)
    try:
        return await handler(request)
    except ApiError as exc:
        return _error_response(exc)
    except web.HTTPException as exc:  # aiohttp's own: a wrong method, an unknown path, a body past the limit
        if exc.status < 400:
            raise
        allow = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return _error_response(ApiError(exc.status, exc.reason, "http_error", headers=allow))
    except ConnectionResetError:  # the client went away: the server's log says so
        raise
    except Exception:  # a fault of ours: the traceback goes to the log, never to the client
        log.exception("%s %s failed", request.method, request.path)
        return _error_response(internal_error())


def _error_response(exc: ApiError) -> web.Response:
    return web.json_response(error_body(exc), status=exc.status, headers=exc.headers)
