import pytest

from engine.decoding.text import ChatTemplate, Message, StopMatcher, TemplateRenderError, TextStream, render_parts


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


def test_stop_matcher_releases_held_text_that_was_not_a_stop():
    m = StopMatcher(["STOP"])
    assert m.push("ab ST") == ("ab ", False)
    assert m.push("ay") == ("STay", False)


def test_chat_template_renders_messages():
    t = ChatTemplate(None)
    text = t.render([Message("user", "hi")])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


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
