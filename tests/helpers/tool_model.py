"""The bundled model with a chat template that takes tools, in Hermes' markup: the bundled model's own
template has no tools, and the markers are the same ChatML ones, so only the template changes."""

from __future__ import annotations

from pathlib import Path

# The tools go into the system turn as JSON lines; a call is a line of JSON between <tool_call> tags; a tool's
# answer comes back in the user's turn between <tool_response> tags.
HERMES_TEMPLATE = """\
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}You can call these functions, listed between <tools> tags:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
To call one, write its name and arguments as JSON between <tool_call> tags:
<tool_call>
{"name": "function name", "arguments": {"argument": "value"}}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}<|im_start|>assistant
{{ message.content }}
{%- for call in message.tool_calls or [] %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


def write_with_template(source: str | Path, path: Path, template: str = HERMES_TEMPLATE) -> Path:
    """A copy of the GGUF ``source`` at ``path`` whose chat template is ``template``."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = gguf.GGUFReader(str(source), "r")
    arch = reader.fields[gguf.Keys.General.ARCHITECTURE].contents()
    writer = gguf.GGUFWriter(str(path), arch, endianess=reader.endianess)
    new = {gguf.Keys.Tokenizer.CHAT_TEMPLATE: MetadataDetails(gguf.GGUFValueType.STRING, template)}
    copy_with_new_metadata(reader, writer, new, [])
    return path
