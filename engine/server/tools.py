"""Tools (function calling): offered through the model's own chat template, called in the model's own markup,
every call held to its tool's parameters by a grammar.

A model writes a call in the markup it was trained on; two are read here, told apart by the template:
- Hermes' (Qwen 2.5, Hermes, SmolLM 3 and most recent small models): ``<tool_call>`` + a line of JSON
  ``{"name": …, "arguments": {…}}`` + ``</tool_call>``, one block a call;
- Llama 3's: the reply is one JSON object ``{"name": …, "parameters": {…}}``.

``ToolUse.constraint`` is the grammar of what the reply may be: with ``tool_choice`` "auto" text or calls
(the model chooses with its first token), "required" calls only, a named function a call of that one,
"none" text without calls. Each call's JSON is a schema's (the tool's name as a constant, its parameters
as given), so the arguments always parse and match, and the markup, the keys and the name are text the
grammar forces: drafts that land whatever the machine (grammar.py).
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from engine.decoding.grammar import JSON_LAYOUT, Constraint
from engine.decoding.text import ChatTemplate, ToolCall

HERMES, LLAMA3 = "hermes", "llama3"
OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_TOOLS = 64


class ToolsUnsupported(ValueError):
    """The loaded model cannot take tools: its template has none, or its markup is not one read here."""


def markup_of(template: ChatTemplate) -> str:
    """The tool-call markup ``template``'s model writes; ToolsUnsupported when it takes no tools."""
    if not template.takes_tools:
        raise ToolsUnsupported("the loaded model's chat template does not take tools")
    if OPEN in template.source:
        return HERMES
    if "<|python_tag|>" in template.source or '"parameters"' in template.source:
        return LLAMA3
    raise ToolsUnsupported("the loaded model's chat template takes tools, but not in a markup this server reads "
                           "(Hermes' <tool_call> blocks or Llama 3's JSON)")


def takes_tool_calls(template: ChatTemplate) -> bool:
    """Whether a model with ``template`` can be offered tools here (it takes them, in a markup read here)."""
    try:
        markup_of(template)
    except ToolsUnsupported:
        return False
    return True


@dataclass(frozen=True)
class ToolUse:
    """The tools a request offers and how the model may use them (requests.py checks the fields)."""

    tools: tuple[dict[str, Any], ...]  # OpenAI's function tools, as given
    choice: str = "auto"  # "auto" | "none" | "required" | "function" (then ``name``)
    name: str = ""
    parallel: bool = True

    @property
    def calls_allowed(self) -> bool:
        return self.choice != "none"

    def constraint(self, markup: str) -> Constraint:
        """The grammar of the reply (see the module's docstring)."""
        if markup == HERMES:
            call = f'"{OPEN}\\n" body "\\n{CLOSE}"'
            calls = "call (\"\\n\" call)*" if self.parallel else "call"
            text = f"TEXT: /(?s:.+)/ & ~/(?s:.*){OPEN}(?s:.*)/"
        else:
            call, calls, text = "body", "call", "TEXT: /(?s:[^{].*)/"
        start = {"auto": "TEXT | calls", "none": "TEXT", "required": "calls", "function": "calls"}[self.choice]
        lines = [f"start: {start}", f"calls: {calls}", f"call: {call}", f"body: %json {json.dumps(self._body(markup))}",
                 text]
        return Constraint("lark", "\n".join(lines))

    def _body(self, markup: str) -> dict[str, Any]:
        """The JSON schema of one call: any offered tool's (or the named one's) name and arguments."""
        key = "arguments" if markup == HERMES else "parameters"
        functions = [t["function"] for t in self.tools
                     if self.choice != "function" or t["function"]["name"] == self.name]
        options = [{"type": "object",
                    "properties": {"name": {"const": f["name"]}, key: f.get("parameters") or {"type": "object"}},
                    "required": ["name", key], "additionalProperties": False} for f in functions]
        schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
        return {**schema, "x-guidance": JSON_LAYOUT}


def parse_calls(text: str) -> tuple[str | None, list[ToolCall]]:
    """A reply's text and the tool calls it makes, in either markup (the grammar made them well formed):
    (the text outside the calls or None when there is none, the calls)."""
    stripped = text.strip()
    if stripped.startswith(OPEN):
        calls = []
        for block in stripped.split(OPEN)[1:]:
            body = block.split(CLOSE)[0]
            calls += _call(body)
        return (None, calls) if calls else (text, [])
    if stripped.startswith("{"):
        calls = _call(stripped)
        return (None, calls) if calls else (text, [])
    return text, []


def _call(body: str) -> list[ToolCall]:
    try:
        obj = json.loads(body)
    except ValueError:
        return []
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return []
    args = obj.get("arguments", obj.get("parameters"))
    if not isinstance(args, dict):
        return []
    return [ToolCall("call_" + secrets.token_hex(12), obj["name"], json.dumps(args, ensure_ascii=False))]


def may_be_calls(text: str) -> bool:
    """Whether a reply that begins with ``text`` may yet be tool calls (its text is held back from a stream)."""
    head = text.lstrip()
    return OPEN.startswith(head) or head.startswith(OPEN) or head.startswith("{")
