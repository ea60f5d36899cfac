"""What a model writes is shown as written: Markdown without HTML, links that open only on the web or by mail."""

from __future__ import annotations

import re

import pytest
from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices

from app.marks import Run, TokenMarks
from app.widgets import markdown_view
from app.widgets.markdown_view import MarkdownView, images_as_links, open_link
from app.widgets.marked_text import MarkedView
from app.widgets.message_bubble import MessageBubble
from tests.helpers.app_fixtures import OFFSCREEN_NOISE

pytestmark = OFFSCREEN_NOISE

# Replies a chat about code, markup and maths holds. Markdown's own syntax (emphasis, fences, list markers,
# link targets) is not text to show; everything else is, character for character.
CORPUS = [
    "Use the <div> tag to group elements, then close it.\n\nA second paragraph follows.",
    "In C++, write std::vector<int> v; and then v.push_back(1).\nThat adds one.",
    "Compare a<b and b>c here.\n\nEnd.",
    "The <script>alert(1)</script> tag runs JS.",
    'Hello <span style="color:red;font-size:40px">BIG RED</span> and after.',
    "A map is std::map<std::string, std::vector<int>> in C++.",
    "Generics: List<String> names = new ArrayList<>();",
    "Rust: fn parse<T: FromStr>(s: &str) -> Option<T>",
    "An image <img src=/etc/hosts> in the middle of a sentence.",
    "Close with </p> and </body></html> at the end.",
    "<!-- a comment --> is how HTML comments look.",
    "Escape less-than as &lt; and ampersand as &amp; in HTML.",
    "The arrow -> and the fat arrow => and <=> the spaceship.",
    "```html\n<div class=\"box\">\n  <p>Hi</p>\n</div>\n```",
    "```cpp\n#include <vector>\nint main() { std::vector<int> v; }\n```",
    "Inline code `<b>bold?</b>` stays as written.",
    "[the manual](https://example.org/manual) explains it.",
    "[x](file:///etc/passwd) is a link to a local file.",
    "![logo](/usr/share/pixmaps/debian-logo.png) and text after the picture.",
    "![remote](https://example.org/logo.png) is not fetched.",
    "LaTeX: $\\frac{a}{b} < \\sqrt{c}$ and \\(x^2 + y^2 = z^2\\).",
    "Emoji: 😀 🎉 👍🏽 and flags 🇦🇹.",
    "Hebrew: שלום עולם, Arabic: مرحبا بالعالم.",
    "Japanese: 日本語のテキストです。",
    "x" * 600 + " a very long line without spaces before this.",
    "A table:\n\n| a | b |\n|---|---|\n| <td> | 1<2 |",
    "- item <one>\n- item <two>\n- item three",
    "1. first <step>\n2. second step",
    "> a quote with <tags> inside",
    "**bold <b>not html</b>** and *em <i>x</i>*",
    "Mail me: <mailto:someone@example.org> or <https://example.org>.",
    "Template: {{ name }} and {% if x < 3 %}small{% endif %}.",
    "Shell: echo $HOME > out.txt 2>&1 < in.txt",
]

_MARKDOWN_SYNTAX = re.compile(r"\]\([^)]*\)|[*_`#\[\]!|>\-]|^\s*\d+\.\s", re.MULTILINE)


def visible(text: str) -> str:
    """The characters of ``text`` a reader should see, Markdown's own syntax and all whitespace left out."""
    text = re.sub(r"^```\w*$", "", text, flags=re.MULTILINE)  # fences and their language
    text = re.sub(r"<(https?://[^>]+|mailto:[^>]+)>", r"\1", text)  # an autolink shows its address
    text = text.replace("&lt;", "<").replace("&amp;", "&")  # entities show as the characters they name
    text = re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text)  # a backslash before punctuation is Markdown's escape
    text = text.replace("mailto:", "")  # a mail link shows its address
    return re.sub(r"\s+", "", _MARKDOWN_SYNTAX.sub("", text))


def shown(plain: str) -> str:
    return re.sub(r"\s+", "", _MARKDOWN_SYNTAX.sub("", plain.replace("mailto:", "")))


@pytest.fixture
def no_resources(monkeypatch) -> list[str]:
    """Fails the test if a view asks for a resource (an image, a style sheet) by name: records them."""
    asked: list[str] = []
    real = markdown_view.FittedBrowser.loadResource

    def recording(self, kind, name):
        asked.append(QUrl(name).toString())
        return real(self, kind, name)

    monkeypatch.setattr(markdown_view.FittedBrowser, "loadResource", recording)
    return asked


@pytest.mark.parametrize("reply", CORPUS, ids=range(len(CORPUS)))
def test_every_character_of_a_reply_is_shown_in_the_bubble_and_the_tinted_view(qtbot, reply, no_resources):
    bubble = MessageBubble("assistant")
    qtbot.addWidget(bubble)
    bubble.set_text(reply)
    expected = visible(reply)
    assert expected
    assert visible_subsequence(expected, shown(bubble.body.toPlainText())), bubble.body.toPlainText()

    marked = MarkedView()
    qtbot.addWidget(marked)
    marked.show_marks(TokenMarks([Run(reply, "own", 0, 1)]))
    assert visible_subsequence(expected, shown(marked.toPlainText())), marked.toPlainText()
    assert no_resources == []  # no image, style sheet or file named in a reply was asked for


def visible_subsequence(expected: str, got: str) -> bool:
    """Whether every character of ``expected`` is in ``got``, in order (the widget may add list numbers)."""
    it = iter(got)
    return all(ch in it for ch in expected)


def test_the_table_of_the_report_shows_each_reply_whole(qtbot):
    view = MarkdownView()
    qtbot.addWidget(view)
    for reply, must_show in [
        ("Use the <div> tag to group elements, then close it.\n\nMore.", "Use the <div> tag to group elements"),
        ("In C++, write std::vector<int> v; and then v.push_back(1).", "std::vector<int> v; and then"),
        ("Compare a<b and b>c here.\n\nEnd.", "Compare a<b and b>c here."),
        ("The <script>alert(1)</script> tag runs JS.", "The <script>alert(1)</script> tag runs JS."),
    ]:
        view.set_markdown(reply)
        assert must_show in view.toPlainText()
    view.set_markdown('Hello <span style="color:red;font-size:40px">BIG RED</span>')
    assert '<span style="color:red;font-size:40px">BIG RED</span>' in view.toPlainText()  # text, not a style


def test_an_image_in_a_reply_shows_its_words_and_address_and_nothing_is_loaded(qtbot, no_resources):
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown(
        "See ![the logo](/usr/share/pixmaps/logo.png) and `![code](x.png)`.\n\n```\n![fenced](y.png)\n```"
    )
    assert "the logo" in view.toPlainText() and "![code](x.png)" in view.toPlainText()
    assert "![fenced](y.png)" in view.toPlainText()
    assert no_resources == []
    assert images_as_links("![a](b) and ![c](d)") == "[a](b) and [c](d)"


@pytest.mark.parametrize(("url", "opens"), [
    ("https://example.org/a", True), ("http://example.org", True), ("mailto:a@example.org", True),
    ("file:///etc/passwd", False), ("/etc/passwd", False), ("javascript:alert(1)", False),
    ("ftp://example.org/x", False), ("lookahead-chat://x", False), ("data:text/html,hi", False),
])
def test_a_clicked_link_opens_outside_the_app_only_on_the_web_or_by_mail(monkeypatch, url, opens):
    opened: list[str] = []

    def open_url(url: QUrl) -> bool:
        opened.append(url.toString())
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(open_url))
    assert open_link(QUrl(url)) is opens
    assert opened == ([QUrl(url).toString()] if opens else [])


def test_a_click_on_a_link_in_a_reply_never_navigates_the_bubble(qtbot, monkeypatch):
    opened: list[str] = []

    def open_url(url: QUrl) -> bool:
        opened.append(url.toString())
        return True

    monkeypatch.setattr(QDesktopServices, "openUrl", staticmethod(open_url))
    view = MarkdownView()
    qtbot.addWidget(view)
    view.set_markdown("[local](file:///etc/passwd) and [web](https://example.org)")
    before = view.toPlainText()
    view.anchorClicked.emit(QUrl("file:///etc/passwd"))
    view.anchorClicked.emit(QUrl("https://example.org"))
    assert opened == ["https://example.org"]
    assert view.toPlainText() == before and not view.openLinks() and not view.openExternalLinks()
