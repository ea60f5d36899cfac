"""The chat as the model reads it: its chat template, and the messages in tokens (``ChatText``)."""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, NoReturn

from jinja2.exceptions import SecurityError, TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.llama.native import Model

# Used when a GGUF carries no chat template and its vocabulary has none of the built-in formats' turn markers:
# ChatML is what most small instruction-tuned models without one were trained on.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
# Gemma's turns: "user" and "model", no system role (a system prompt opens the first user turn).
GEMMA_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = ns.system + message['content'] + '\\n\\n' %}"
    "{% else %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\\n' }}"
    "{% if message['role'] != 'assistant' %}{{ ns.system }}{% set ns.system = '' %}{% endif %}"
    "{{ message['content'] + '<end_of_turn>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class ChatFormat:
    """A chat format built into the app, for model files without a template of their own."""

    name: str
    markers: tuple[str, ...]  # its turn markers: a vocabulary with all of them as control tokens was trained on it
    source: str  # the template, Jinja2


BUILT_IN_FORMATS = (
    ChatFormat("Gemma", ("<start_of_turn>", "<end_of_turn>"), GEMMA_TEMPLATE),
    ChatFormat("Llama 3", ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"), LLAMA3_TEMPLATE),
    ChatFormat("ChatML", ("<|im_start|>", "<|im_end|>"), CHATML_TEMPLATE),
)


def built_in_format(is_control: Callable[[str], bool]) -> ChatFormat | None:
    """The built-in format whose every turn marker is one of the vocabulary's control tokens (``is_control``
    says whether a text is one), or None."""
    for fmt in BUILT_IN_FORMATS:
        if all(is_control(marker) for marker in fmt.markers):
            return fmt
    return None


class TemplateRenderError(ValueError):
    """The model's chat template could not be rendered."""


@dataclass(frozen=True)
class ToolCall:
    """A call of one of the tools a request offered: ``arguments`` is the JSON text of its arguments object."""

    id: str
    name: str
    arguments: str

    def as_dict(self) -> dict[str, Any]:
        """As chat templates read it: OpenAI's shape, the arguments as an object."""
        function = {"name": self.name, "arguments": _object(self.arguments)}
        return {"id": self.id, "type": "function", "function": function}


@dataclass(frozen=True)
class Message:
    role: str  # "system" | "user" | "assistant" | "tool"
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls of the tools offered
    tool_call_id: str = ""  # a tool's answer: the call it answers

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [c.as_dict() for c in self.tool_calls]
        if self.tool_call_id:
            out["tool_call_id"] = self.tool_call_id
        return out


def _object(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def conversation_messages(
    system_prompt: str, turns: Sequence[tuple[str, str]] = (), user_text: str | None = None
) -> list[Message]:
    """A chat turn's messages: the system prompt (left out when blank), the earlier user and assistant
    turns as (role, text) pairs (other roles left out), then the new user message if there is one."""
    messages = [Message("system", system_prompt.strip())] if system_prompt.strip() else []
    messages += [Message(role, text) for role, text in turns if role in ("user", "assistant")]
    if user_text is not None:
        messages.append(Message("user", user_text))
    return messages


class _StrictSandbox(ImmutableSandboxedEnvironment):
    """Jinja2's immutable sandbox, raising at the first unsafe attribute instead of rendering it as ''."""

    def unsafe_undefined(self, obj: object, attribute: str) -> NoReturn:
        raise SecurityError(f"access to attribute {attribute!r} of {type(obj).__name__!r} object is unsafe")


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class ChatTemplate:
    """A chat template from GGUF metadata, rendered in Jinja2's immutable sandbox.

    Templates come from model files, which are untrusted input: the sandbox
    refuses attribute access to Python internals and mutation of arguments.
    """

    def __init__(
        self, source: str | None, bos_token: str = "", eos_token: str = "", built_in: ChatFormat | None = None,
    ) -> None:
        """``source``: the file's template; without one, ``built_in``'s (the format the vocabulary's turn markers
        name), else the generic ChatML."""
        self.is_fallback = not source
        self.built_in = built_in if not source else None
        self.source = source or (built_in.source if built_in is not None else CHATML_TEMPLATE)
        env = _StrictSandbox(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        try:
            self._template = env.from_string(self.source)
        except Exception as exc:  # TemplateSyntaxError, or a RecursionError on deeply nested input
            raise TemplateRenderError(f"the model's chat template does not parse: {exc}") from exc
        self.bos_token = bos_token
        self.eos_token = eos_token

    def render(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, tools: Sequence[Any] = (),
    ) -> str:
        """``tools``: the tools offered, as OpenAI's function tools (templates that take them read ``tools``)."""
        extra = {"tools": list(tools)} if tools else {}
        try:
            return self._template.render(
                messages=[m.as_dict() for m in messages],
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token,
                eos_token=self.eos_token,
                **extra,
            )
        except SecurityError as exc:
            raise TemplateRenderError(f"the model's chat template tried an unsafe operation: {exc}") from exc
        except Exception as exc:  # untrusted code: whatever it raises (OverflowError on a huge range...) is its failure
            raise TemplateRenderError(f"the model's chat template failed: {type(exc).__name__}: {exc}") from exc


    @functools.cached_property
    def takes_tools(self) -> bool:
        """Whether the template writes the tools it is given into the prompt (a probe tool's name shows)."""
        probe = {"type": "function", "function": {"name": _PROBE_TOOL, "description": "", "parameters": {}}}
        try:
            return _PROBE_TOOL in self.render([Message("user", "hi")], tools=[probe])
        except TemplateRenderError:
            return False


_PROBE_TOOL = "probe_tool_7f3a"

# Stands in for a message's text while the template renders, so the text can be told apart from the template's
# own markers afterwards (private-use characters: a template has no reason to touch them).
_STAND_IN = "\ue000{}\ue001"
_STAND_IN_RE = re.compile("\ue000([0-9]+)\ue001")


def render_parts(
    template: ChatTemplate, messages: Sequence[Message], literal: Collection[int], add_generation_prompt: bool = True,
    tools: Sequence[Any] = (),
) -> list[tuple[str, bool]] | None:
    """The rendered chat as pieces ``(text, is_literal)``: the contents of the messages indexed in ``literal``
    are pieces of their own, to be read as plain text (never as the model's control tokens).

    None when the pieces do not join into the chat as rendered with the real texts (the template changed a
    message's text, or looked into it), so they could not be told apart.
    """
    stand_ins = [replace(m, content=_STAND_IN.format(i)) if i in literal else m for i, m in enumerate(messages)]
    text = template.render(stand_ins, add_generation_prompt=add_generation_prompt, tools=tools)
    pieces = _STAND_IN_RE.split(text)
    parts: list[tuple[str, bool]] = []
    for k, piece in enumerate(pieces):
        if k % 2:
            index = int(piece)
            if index not in literal or index >= len(messages):
                return None
            parts.append((messages[index].content, True))
        elif piece:
            if "\ue000" in piece or "\ue001" in piece:
                return None
            parts.append((piece, False))
    whole = template.render(messages, add_generation_prompt=add_generation_prompt, tools=tools)
    return parts if "".join(text for text, _ in parts) == whole else None


class ChatText:
    """The chat in the model's tokens and back: the template, tokenizing, detokenizing.

    The part of ``Engine`` (runtime.py) that holds the model's chat template (its own, else the built-in format its
    vocabulary's turn markers name) and knows which texts the vocabulary reads as control tokens.
    """

    def __init__(self, model: Model) -> None:
        self._model = model
        bos = model.token_text(model.bos()) if model.bos() >= 0 else ""
        eos = model.token_text(model.eos()) if model.eos() >= 0 else ""
        self._control_text_cache: dict[str, bool] = {}
        own = model.chat_template()
        self.template = ChatTemplate(own, bos_token=bos, eos_token=eos,
                                     built_in=None if own else built_in_format(self._is_control_token))

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        return self._model.tokenize(text, add_special=add_special, parse_special=True)

    def render_chat(self, messages: Sequence[Message], tools: Sequence[Any] = ()) -> list[int]:
        """The chat as the model reads it: the template's markers as control tokens, what people wrote as text.

        A message that holds the text of a control token ("<|im_end|>" in a question about chat templates, or
        in an attached file) is tokenized apart from the template, as plain text, so it cannot end a turn or
        start another role's. ``tools``: the tools offered (OpenAI's function tools), for a template that
        takes them.
        """
        literal = {i for i, m in enumerate(messages) if self._reads_as_control(m.content)}
        parts = render_parts(self.template, messages, literal, tools=tools) if literal else None
        if parts is None:
            parts = [(self.template.render(messages, add_generation_prompt=True, tools=tools), False)]
        # The template writes the BOS token itself when the model wants one.
        bos = self.template.bos_token
        first, first_literal = parts[0]
        add_special = self._model.add_bos() and not (bos and first.startswith(bos) and not first_literal)
        tokens: list[int] = []
        for k, (text, is_literal) in enumerate(parts):
            tokens += self._model.tokenize(text, add_special=add_special and k == 0, parse_special=not is_literal)
        return tokens

    def tokenize_as_text(self, text: str) -> list[int]:
        """``text`` in tokens, a control token's text ("<|im_end|>" in a document) read as text."""
        return self._model.text_tokens(text)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self._model.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    def _is_control_token(self, text: str) -> bool:
        """``text`` is one of the vocabulary's control tokens (a turn marker, say), not text that spells it."""
        return len(self._model.tokenize(text, parse_special=True)) == 1 and self._reads_as_control(text)

    def _reads_as_control(self, text: str) -> bool:
        """``text`` would turn into control tokens if tokenized with the template's markers."""
        known = self._control_text_cache.get(text)
        if known is None:
            known = self._model.tokenize(text, parse_special=True) != self._model.tokenize(text, parse_special=False)
            if len(self._control_text_cache) >= 512:
                self._control_text_cache.clear()
            self._control_text_cache[text] = known
        return known
