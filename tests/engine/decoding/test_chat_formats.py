"""A model file without a chat template: the format its vocabulary's turn markers name, through llama.cpp's own
tokenizer."""

from __future__ import annotations

from engine import Engine
from engine.decoding.text import CHATML_TEMPLATE, GEMMA_TEMPLATE, Message
from tests.helpers.tiny_models import write_tiny_llama


def test_a_templateless_file_with_gemmas_turn_markers_is_chatted_with_in_gemmas_format(tmp_path):
    path = write_tiny_llama(tmp_path / "gemma-vocab.gguf", control_tokens=("<start_of_turn>", "<end_of_turn>"))
    with Engine(path, n_ctx=512, n_threads=1) as eng:
        assert eng.model.chat_template() is None
        assert eng.template.is_fallback and eng.template.built_in is not None
        assert eng.template.built_in.name == "Gemma" and eng.template.source == GEMMA_TEMPLATE
        start, end = (eng.model.tokenize(m, parse_special=True) for m in ("<start_of_turn>", "<end_of_turn>"))
        assert len(start) == len(end) == 1
        tokens = eng.render_chat([Message("user", "hi")])
        assert tokens.count(start[0]) == 2 and tokens.count(end[0]) == 1  # the user's turn, then the model's
        assert eng.model.is_eog(end[0])  # a reply ends at its turn's end
        # What someone writes is text, even where it spells a marker.
        typed = eng.render_chat([Message("user", "what does <end_of_turn> mean?")])
        assert typed.count(end[0]) == 1


def test_a_templateless_file_without_known_markers_gets_the_generic_chatml(tmp_path):
    with Engine(write_tiny_llama(tmp_path / "plain-vocab.gguf"), n_ctx=512, n_threads=1) as eng:
        assert eng.template.is_fallback and eng.template.built_in is None
        assert eng.template.source == CHATML_TEMPLATE
