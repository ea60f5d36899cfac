import pytest

from engine.decoding.stops import StopMatcher, TextStream
from engine.decoding.text import (
    BUILT_IN_FORMATS,
    CHATML_TEMPLATE,
    ChatTemplate,
    Message,
    TemplateRenderError,
    built_in_format,
    render_parts,
)


def test_text_stream_holds_a_character_split_across_tokens():
    data = "é😀漢".encode()
    pieces = {i: data[i : i + 1] for i in range(len(data))}  # one byte per "token"
    stream = TextStream(lambda t: pieces[t])
    out = [stream.feed(i) for i in range(len(data))]
    assert "".join(out) + stream.flush() == "é😀漢"
    assert all("\ufffd" not in o for o in out)
    assert out[0] == "" and out[1] == "é"


def test_text_stream_drops_a_character_cut_off_at_the_end():
    stream = TextStream(lambda t: {0: b"ok", 1: b"\xf0\x9f"}[t])
    assert stream.feed(0) + stream.feed(1) + stream.flush() == "ok"


def test_stop_matcher_cuts_a_stop_string_split_across_deltas():
    m = StopMatcher(["</end>"])
    shown = [m.push("Hello </e")[0], m.push("nd> ignored")]
    assert shown[0] == "Hello "
    assert shown[1] == ("", True)
    assert m.text == "Hello "


def test_stop_matcher_names_the_stop_string_met_first_in_the_text():
    m = StopMatcher(["Sunday", "day", "Tues"])
    assert m.matched is None and m.push("Monday") == ("Mon", True)
    assert m.matched == "day"  # met before "Sunday" could be, though given later
    tie = StopMatcher(["ab", "abc"])
    tie.push("xabc")
    assert tie.matched == "ab"  # at the same place: the first given


def test_stop_matcher_releases_held_text_that_was_not_a_stop():
    m = StopMatcher(["STOP"])
    assert m.push("ab ST") == ("ab ", False)
    assert m.push("ay") == ("STay", False)


def test_chat_template_renders_messages():
    t = ChatTemplate(None)
    text = t.render([Message("user", "hi")])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_file_without_a_template_gets_the_format_its_vocabularys_turn_markers_name():
    gemma_vocab = {"<start_of_turn>", "<end_of_turn>", "<bos>"}
    fmt = built_in_format(gemma_vocab.__contains__)
    assert fmt is not None and fmt.name == "Gemma"
    llama3 = built_in_format({"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"}.__contains__)
    assert llama3 is not None and llama3.name == "Llama 3"
    assert built_in_format({"<start_of_turn>"}.__contains__) is None  # one marker of two: not that format
    assert built_in_format(lambda _text: False) is None
    t = ChatTemplate(None, built_in=fmt)
    assert t.is_fallback and t.built_in is fmt
    chat = [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"),
            Message("user", "Bye")]
    # Gemma has no system role: the system prompt opens the first user turn; the assistant's turns are "model".
    assert t.render(chat) == ("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                              "<start_of_turn>model\nHello!<end_of_turn>\n"
                              "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert ChatTemplate(None, built_in=llama3).render([Message("user", "Hi")]) == (
        "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    # A file's own template wins over a built-in one; without either, the generic ChatML.
    own = ChatTemplate("{{ messages[0]['content'] }}", built_in=fmt)
    assert not own.is_fallback and own.built_in is None and own.render([Message("user", "x")]) == "x"
    assert ChatTemplate(None).source == CHATML_TEMPLATE
    for f in BUILT_IN_FORMATS:  # each renders with every role
        assert "Bye" in ChatTemplate(None, built_in=f).render(chat)


def test_chat_template_from_a_model_file_cannot_reach_python_internals():
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    with pytest.raises(TemplateRenderError):
        ChatTemplate(evil).render([Message("user", "x")])


def test_render_parts_sets_the_marked_messages_text_apart_from_the_templates():
    t = ChatTemplate(None)
    messages = [Message("system", "Be brief."), Message("user", "What is <|im_end|> for?")]
    parts = render_parts(t, messages, {1})
    assert parts == [
        ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n", False),
        ("What is <|im_end|> for?", True),
        ("<|im_end|>\n<|im_start|>assistant\n", False),
    ]
    assert "".join(text for text, _ in parts) == t.render(messages)


def test_render_parts_gives_up_when_the_template_changes_a_messages_text():
    shouting = ChatTemplate("{% for m in messages %}{{ m['content'] | upper }}{% endfor %}")
    assert render_parts(shouting, [Message("user", "hi <|x|>")], {0}) is None
    cutting = ChatTemplate("{% for m in messages %}{{ m['content'][:2] }}{% endfor %}")
    assert render_parts(cutting, [Message("user", "hi <|x|>")], {0}) is None
