"""One message of the conversation: its bubble, with the files it carried (chips) and, for a reply, its sources."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from PySide6.QtCore import Qt, QTimer, Signal, Slot
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from ..attachments import Attachment, ReplySources
from ..marks import TokenMarks
from .attachments_bar import FlowLayout
from .markdown_view import ActionButton, CopyButton, MarkdownView
from .marked_text import MarkedView
from .plain import Label
from .plain import tip as plain_tip

_ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}
FLASH_MS = 1500  # how long a message found by a search stays outlined
PASSAGE_SHOWN_CHARS = 4000  # of a passage under Sources: a whole file's text would make the chat crawl


def seen_text(fraction: float) -> str:
    """"seen 23%" for the share of a file the model was given ("seen <1%" for a sliver, never a rounded 100%)."""
    if fraction > 0 and fraction < 0.01:
        return "seen <1%"
    return f"seen {math.floor(fraction * 100 + 1e-9)}%"


def _named(label: Label, object_name: str) -> Label:
    label.setObjectName(object_name)
    return label


class AttachmentChips(QWidget):
    """The files a user message carried, one chip each: ``chip_text()`` and, when the model saw only part, how much."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._flow = FlowLayout(self, spacing=4)
        self.chips: list[QLabel] = []

    def set_attachments(self, attachments: Sequence[Attachment], coverage: Mapping[str, float] | None) -> None:
        for chip in self.chips:
            self._flow.removeWidget(chip)
            chip.deleteLater()
        self.chips = []
        for attachment in attachments:
            text = attachment.chip_text()
            tip = attachment.path or f"{attachment.name} (its text is kept with the message)"
            seen = (coverage or {}).get(attachment.name)
            if seen is not None and seen < 1.0:
                text += f" · {seen_text(seen)}"
                tip += f"\nThe model was given {seen_text(seen)[5:]} of it: the passages that best match the question."
            elif seen is not None:
                tip += "\nThe model was given all of it."
            chip = _named(Label(text), "messageAttachmentChip")
            chip.setToolTip(plain_tip(tip))
            chip.setAccessibleName(f"Attached file: {text}")
            self.chips.append(chip)
            self._flow.addWidget(chip)

    def texts(self) -> list[str]:
        return [chip.text() for chip in self.chips]


class SourcesSection(QWidget):
    """Under a reply: "Sources (n)", which opens a list of the passages the reply was given (file · where); each
    opens to show its text, as plain text."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.sources = ReplySources()
        self.toggle = self._arrow_button("", self._on_toggled)
        self.toggle.setObjectName("sourcesToggle")
        self.body = QWidget()
        self.body.setVisible(False)
        self._body_layout = QVBoxLayout(self.body)
        self._body_layout.setContentsMargins(16, 0, 0, 0)
        self._body_layout.setSpacing(2)
        self.note = _named(Label(""), "sourcesNote")
        self.note.setWordWrap(True)
        self.note.setEnabled(False)  # a quiet line, like the stats line
        self._body_layout.addWidget(self.note)
        self.citation_buttons: list[ActionButton] = []
        self.passages: list[QLabel] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 2, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.toggle, 0, Qt.AlignmentFlag.AlignLeft)
        layout.addWidget(self.body)

    def _arrow_button(self, text: str, slot: Callable[[bool], object]) -> ActionButton:
        button = ActionButton(text, "", self)
        button.setCheckable(True)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        button.setArrowType(Qt.ArrowType.RightArrow)
        button.toggled.connect(slot)
        return button

    def set_sources(self, sources: ReplySources) -> None:
        self.sources = sources
        for widget in (*self.citation_buttons, *self.passages):
            self._body_layout.removeWidget(widget)
            widget.deleteLater()
        self.citation_buttons, self.passages = [], []
        n = len(sources.citations)
        self.toggle.setText(f"Sources ({n})")
        self.toggle.setToolTip("The passages of the attached files this reply was given")
        self.toggle.setAccessibleName(f"Sources: {n} passage{'s' if n != 1 else ''}")
        self.note.setText(
            "The files went in whole." if sources.whole else
            "The files did not fit whole: these passages, the ones that best match the question, went in."
        )
        after: QWidget = self.toggle
        for citation in sources.citations:
            button = self._arrow_button(f"{citation.name} · {citation.where}", self._on_citation_toggled)
            button.setToolTip("Show the passage's text")
            text = citation.text.strip()  # a passage cut at a page's end brings its blank lines
            if len(text) > PASSAGE_SHOWN_CHARS:
                more = len(text) - PASSAGE_SHOWN_CHARS
                text = text[:PASSAGE_SHOWN_CHARS] + f"\n… ({more:,} more characters)"
            passage = _named(Label(text), "sourcePassage")
            passage.setWordWrap(True)
            passage.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            passage.setVisible(False)
            self._body_layout.addWidget(button, 0, Qt.AlignmentFlag.AlignLeft)
            self._body_layout.addWidget(passage)
            QWidget.setTabOrder(after, button)  # Tab goes down the list as it is shown
            after = button
            self.citation_buttons.append(button)
            self.passages.append(passage)

    def last_in_tab_order(self) -> QWidget:
        return self.citation_buttons[-1] if self.citation_buttons else self.toggle

    def is_expanded(self) -> bool:
        return self.toggle.isChecked()

    def set_expanded(self, expanded: bool, passages: bool = False) -> None:
        """Open (or close) the list; ``passages``: open every passage too."""
        self.toggle.setChecked(expanded)
        for button in self.citation_buttons:
            button.setChecked(passages)

    @Slot(bool)
    def _on_toggled(self, on: bool) -> None:
        self.toggle.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
        self.body.setVisible(on)

    @Slot(bool)
    def _on_citation_toggled(self, on: bool) -> None:
        button = self.sender()
        if button in self.citation_buttons:
            assert isinstance(button, ActionButton)
            button.setArrowType(Qt.ArrowType.DownArrow if on else Qt.ArrowType.RightArrow)
            self.passages[self.citation_buttons.index(button)].setVisible(on)


def tab_stops(owner: QWidget, start: QWidget) -> list[QWidget]:
    """The widgets of ``owner`` that Tab stops at, in tab order from just after ``start`` to the first not its own."""
    stops = []
    widget = start.nextInFocusChain()
    while widget is not None and widget is not start and owner.isAncestorOf(widget):
        if widget.focusPolicy() & Qt.FocusPolicy.TabFocus:
            stops.append(widget)
        widget = widget.nextInFocusChain()
    return stops


class MessageBubble(QFrame):
    """One message: who, its alternatives (‹ 2/3 ›), the Markdown text, actions, and (for replies) the stats line.

    Tab reaches the actions in the order they are shown (‹ › Edit Regenerate Fork Copy),
    then the text and its code blocks' copy buttons; Enter or Space presses a button.

    Signals:
        editRequested(int): "Edit" on a user message (its store id).
        regenerateRequested(): "Regenerate" on the last reply.
        writeOutRequested(): "Write it out" on the last reply, stopped for repeating itself.
        alternativeRequested(int): ‹ or › : show this alternative of the message instead (its store id).
        forkRequested(int): "Fork": a new chat with the conversation down to this message (its store id).
    """

    editRequested = Signal(int)
    regenerateRequested = Signal()
    writeOutRequested = Signal()
    alternativeRequested = Signal(int)
    forkRequested = Signal(int)

    def __init__(
        self, role: str, text: str = "", message_id: int | None = None, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.role = role
        self.message_id = message_id
        self.setObjectName("userBubble" if role == "user" else "assistantBubble")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        header = self._build_header(role)

        self.body = MarkdownView(self)
        self.body.set_markdown(text)
        self._text = text
        self._body_stale = False  # text set while the marked view was shown instead
        self.marks: TokenMarks | None = None
        self.marked: MarkedView | None = None  # made when first shown
        self.attachment_chips: AttachmentChips | None = None  # made for a message that carried files
        self.sources_section: SourcesSection | None = None  # made for a reply that was given passages
        self._show_marks = False
        self.is_left_out = False

        self.stats_label = Label()
        self.stats_label.setObjectName("statsLine")
        self.stats_label.setWordWrap(True)
        self.stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.stats_label.setVisible(False)
        self.stats_label.setEnabled(False)  # the palette's disabled text colour: a quiet footnote

        layout = QVBoxLayout(self)
        layout.setContentsMargins(10, 6, 10, 6)
        layout.setSpacing(2)
        layout.addLayout(header)
        layout.addWidget(self.body)
        self._layout = layout
        layout.addWidget(self.stats_label)
        self.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Maximum)
        self.set_alternatives([])

    def _build_header(self, role: str) -> QHBoxLayout:
        """Who wrote it, ‹ 2/3 ›, and the actions (which of them are shown depends on the role)."""
        self.title = Label(_ROLE_TITLES.get(role, role))
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)

        # Made in the order they are shown, which is the order Tab takes.
        # ‹ 2/3 ›: this message's alternatives (edits, regenerated replies); the chat goes on from the one shown.
        self.alternatives: list[int] = []
        self.previous_button = self._tool_button("‹", "The previous alternative", self._on_previous)
        self.previous_button.setAccessibleName("Previous alternative")
        self.alternative_label = Label()
        self.next_button = self._tool_button("›", "The next alternative", self._on_next)
        self.next_button.setAccessibleName("Next alternative")
        self.edit_button = self._tool_button("Edit", "Edit and resend (the original stays)", self._on_edit)
        self.regenerate_button = self._tool_button("Regenerate", "Generate this reply again", self._on_regenerate)
        self.write_out_button = self._tool_button(
            "Write it out", "This reply was stopped for repeating itself: write it again without stopping it "
            "(the stopped one stays, as an alternative)", self.writeOutRequested.emit)
        self.fork_button = self._tool_button("Fork", "A new chat with the conversation up to here", self._on_fork)
        self.copy_button = CopyButton("Copy", "Copy this message as Markdown", self.text, self)
        self.edit_button.setVisible(role == "user")
        self.regenerate_button.setVisible(False)  # only the last reply, set by the chat view
        self.write_out_button.setVisible(False)  # only the last reply, when the loop guard stopped it
        self.stopped_looping = False
        self._actions_enabled = True
        self.highlighted = False

        header = QHBoxLayout()
        header.setContentsMargins(0, 0, 0, 0)
        header.addWidget(self.title)
        for w in (self.previous_button, self.alternative_label, self.next_button):
            header.addWidget(w)
        header.addStretch(1)
        for b in (self.edit_button, self.regenerate_button, self.write_out_button, self.fork_button,
                  self.copy_button):
            header.addWidget(b)
        return header

    def _tool_button(self, text: str, tip: str, slot: Callable[[], object]) -> ActionButton:
        button = ActionButton(text, tip, self)
        button.clicked.connect(slot)
        return button

    def text(self) -> str:
        """The message as written (Markdown): what Copy puts on the clipboard."""
        return self._text

    def last_in_tab_order(self) -> QWidget:
        """The last of this message's widgets that Tab reaches (the one the next message's follow)."""
        return ([self.copy_button, *tab_stops(self, self.copy_button)])[-1]

    def set_text(self, text: str, marks: TokenMarks | None = None) -> None:
        """The message's text, and how lookahead got it (replies; drawn when Show lookahead is on)."""
        self._text = text
        if marks is not None:
            self.marks = marks
        if self._marks_shown():
            self._body_stale = True  # rendered when the Markdown view comes back
            self._show_marked()
        else:
            self.body.set_markdown(text)
        self._update_view()

    def set_show_lookahead(self, on: bool) -> None:
        """Show the text as written with its runs tinted by source (if it has marks), or as Markdown."""
        self._show_marks = on
        if self._marks_shown():
            self._show_marked()
        elif self._body_stale:
            self.body.set_markdown(self._text)
            self._body_stale = False
        self._update_view()

    def set_left_out(self, left_out: bool) -> None:
        """Dim a message the model no longer sees (it is still saved and exported)."""
        self.is_left_out = left_out
        if left_out and self.graphicsEffect() is None:
            effect = QGraphicsOpacityEffect(self)
            effect.setOpacity(0.45)
            self.setGraphicsEffect(effect)
        elif not left_out and self.graphicsEffect() is not None:
            self.setGraphicsEffect(None)  # type: ignore[arg-type]  # None removes the effect
        self.setToolTip("Left out of what the model sees: the chat outgrew its context" if left_out else "")

    def _show_marked(self) -> None:
        if self.marked is None:
            self.marked = MarkedView(self)
            self._layout.insertWidget(self._layout.indexOf(self.body), self.marked)
            QWidget.setTabOrder(self.body, self.marked)  # where the text is in the tab order, not at the end
        assert self.marks is not None
        self.marked.show_marks(self.marks)

    def _marks_shown(self) -> bool:
        return self._show_marks and self.marks is not None and bool(self.marks.runs)

    def _update_view(self) -> None:
        shown = self._marks_shown()
        self.body.setVisible(not shown)
        if self.marked is not None:
            self.marked.setVisible(shown)

    def set_attachments(self, attachments: Sequence[Attachment], coverage: Mapping[str, float] | None = None) -> None:
        """The files this message carried, a chip each; ``coverage``: each file's share the model was given."""
        if self.attachment_chips is None:
            if not attachments:
                return
            self.attachment_chips = AttachmentChips(self)
            self._layout.insertWidget(1, self.attachment_chips)  # under the title, above the text
        self.attachment_chips.set_attachments(attachments, coverage)
        self.attachment_chips.setVisible(bool(attachments))

    def set_sources(self, sources: ReplySources | None) -> None:
        """The passages of the attached files this reply was given, under "Sources (n)" (None or none: no section)."""
        shown = sources is not None and bool(sources.citations)
        if self.sources_section is None:
            if not shown:
                return
            after = self.last_in_tab_order()
            self.sources_section = SourcesSection(self)
            self._layout.insertWidget(self._layout.indexOf(self.stats_label), self.sources_section)
            QWidget.setTabOrder(after, self.sources_section.toggle)  # after the text, before the next message
        if sources is not None:
            self.sources_section.set_sources(sources)
        self.sources_section.setVisible(shown)

    def set_stats_line(self, line: str) -> None:
        self.stats_label.setText(line)
        self.stats_label.setVisible(bool(line))

    def set_actions_enabled(self, enabled: bool) -> None:
        """Edit, regenerate, fork and the alternatives are off while a reply streams (copy always works)."""
        self._actions_enabled = enabled
        saved = enabled and self.message_id is not None
        self.edit_button.setEnabled(saved)
        self.regenerate_button.setEnabled(enabled)
        self.write_out_button.setEnabled(enabled)
        self.fork_button.setEnabled(saved)
        k = self._alternative_index()
        self.previous_button.setEnabled(saved and k > 0)
        self.next_button.setEnabled(saved and 0 <= k < len(self.alternatives) - 1)

    def set_message_id(self, message_id: int, alternatives: Sequence[int] = ()) -> None:
        """The message was saved (a streamed reply): its id, and its alternatives if it has any."""
        self.message_id = message_id
        self.set_alternatives(alternatives)

    def set_alternatives(self, alternatives: Sequence[int]) -> None:
        """The ids of this message and its alternatives, oldest first (shown as ‹ k/n › if there are two or more)."""
        self.alternatives = list(alternatives)
        shown = len(self.alternatives) > 1 and self.message_id in self.alternatives
        for w in (self.previous_button, self.alternative_label, self.next_button):
            w.setVisible(shown)
        if shown:
            self.alternative_label.setText(f"{self._alternative_index() + 1}/{len(self.alternatives)}")
        self.fork_button.setVisible(self.message_id is not None)
        self.set_actions_enabled(self._actions_enabled)

    def alternative_text(self) -> str:
        """"2/3" when the message has alternatives, else ""."""
        return self.alternative_label.text() if self.alternative_label.isVisibleTo(self) else ""

    def _alternative_index(self) -> int:
        return self.alternatives.index(self.message_id) if self.message_id in self.alternatives else -1

    def flash(self) -> None:
        """Outline the message for a moment (the one a search result opened)."""
        self.highlighted = True
        self.setStyleSheet(f"QFrame#{self.objectName()} {{ border: 2px solid palette(highlight); }}")
        QTimer.singleShot(FLASH_MS, self, self._end_flash)

    @Slot()
    def _end_flash(self) -> None:
        self.highlighted = False
        self.setStyleSheet("")

    @Slot()
    def _on_edit(self) -> None:
        if self.message_id is not None:
            self.editRequested.emit(self.message_id)

    @Slot()
    def _on_regenerate(self) -> None:
        self.regenerateRequested.emit()

    @Slot()
    def _on_fork(self) -> None:
        if self.message_id is not None:
            self.forkRequested.emit(self.message_id)

    @Slot()
    def _on_previous(self) -> None:
        k = self._alternative_index()
        if k > 0:
            self.alternativeRequested.emit(self.alternatives[k - 1])

    @Slot()
    def _on_next(self) -> None:
        k = self._alternative_index()
        if 0 <= k < len(self.alternatives) - 1:
            self.alternativeRequested.emit(self.alternatives[k + 1])
