"""Model → Chat template…: the model's facts and its chat template, and a missing template said out loud."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from PySide6.QtGui import QFontDatabase
from PySide6.QtWidgets import QDialogButtonBox, QMenu

from app.requests import LoadedModel
from app.widgets.model_info import FALLBACK_NOTE, OWN_TEMPLATE_NOTE, ModelInfoDialog
from engine.decoding.text import CHATML_TEMPLATE, GEMMA_TEMPLATE, ChatTemplate, built_in_format
from engine.llama.probe import ProbeResult
from engine.units import format_params, plain_size
from tests.helpers.app_fixtures import OFFSCREEN_NOISE, FakeEngine, fake_model_info, fake_summary
from tests.helpers.optional import present

pytestmark = OFFSCREEN_NOISE

OWN_TEMPLATE = "{% for m in messages %}<|user|>{{ m['content'] }}{% endfor %}<|assistant|>"


def _model(**overrides: Any) -> LoadedModel:
    model = LoadedModel(
        path="/models/smol.gguf", display_name="smol", gguf_name="Smol 135M", architecture="llama",
        file_type="Q4_1", n_ctx=2048, n_params=134_515_008, n_threads=2, lookahead_block_reason=None, load_s=0.5,
        template_source=OWN_TEMPLATE, template_is_fallback=False, n_ctx_train=8192, size_bytes=102_958_944,
        batch_kernels=("Q4_1 (210): one-pass tile kernel (patched); every batch size gives 1-token results",
                       "Q8_0 (1): llama.cpp's kernels; batches are checked on the model"),
    )
    return replace(model, **overrides)


def _facts(dialog: ModelInfoDialog) -> dict[str, str]:
    return {name: label.text() for name, label in dialog.facts.items()}


def test_parameter_counts_and_file_sizes_read_as_people_write_them():
    assert [format_params(n) for n in (134_515_008, 1_711_376_384, 8_030_261_248, 52_000)] == [
        "135M", "1.7B", "8.0B", "52K"]
    assert [plain_size(n) for n in (512, 1_500, 102_958_944, 4_920_000_000)] == [
        "512 bytes", "1.5 KB", "103 MB", "4.9 GB"]


def test_the_dialog_shows_the_models_facts_and_its_own_template_read_only_in_a_fixed_font(qtbot):
    dialog = ModelInfoDialog(_model())
    qtbot.addWidget(dialog)

    assert _facts(dialog) == {
        "Name in the file": "Smol 135M",
        "Architecture": "llama",
        "Parameters": "135M",
        "Quantisation": "Q4_1",
        "Trained context": "8,192 tokens",
        "Context in use": "2,048 tokens",
        "File size": "103 MB",
        "File": "/models/smol.gguf",
        "Batch kernels": "Q4_1 (210): one-pass tile kernel (patched); every batch size gives 1-token results\n"
                         "Q8_0 (1): llama.cpp's kernels; batches are checked on the model",
        "Lookahead": "yes: drafts and the lookahead window",
    }
    assert dialog.name_label.text() == "smol"  # as the status bar and the library name it
    assert dialog.template_note.text() == OWN_TEMPLATE_NOTE
    assert dialog.template_view.toPlainText() == OWN_TEMPLATE
    assert dialog.template_view.isReadOnly()
    # The system's fixed-width font (QFontInfo.fixedPitch is unreliable: Noto Sans Mono reports False).
    assert dialog.template_view.font().family() == QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()


def test_a_header_without_a_context_length_shows_it_as_unknown(qtbot):
    dialog = ModelInfoDialog(_model(n_ctx_train=None, size_bytes=0))
    qtbot.addWidget(dialog)
    assert _facts(dialog)["Trained context"] == "unknown"
    assert _facts(dialog)["File size"] == "unknown"


def test_the_fallback_template_is_shown_with_a_line_saying_it_is_not_the_models_own(qtbot):
    dialog = ModelInfoDialog(_model(template_source=CHATML_TEMPLATE, template_is_fallback=True))
    qtbot.addWidget(dialog)
    assert dialog.template_note.text() == FALLBACK_NOTE
    assert "no chat template" in FALLBACK_NOTE and "generic ChatML" in FALLBACK_NOTE
    assert dialog.template_view.toPlainText() == CHATML_TEMPLATE


# --- through the real worker and window, with an engine whose file has no chat template ---


class _TemplatelessEngine(FakeEngine):
    """A GPT-2 file without a chat template: the engine's own rule, no source, gives the generic fallback (as
    ``FakeEngine``'s template has)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.summary = fake_summary(self.summary.path, name="Bare", architecture="gpt2", context_length=1024,
                                    size_bytes=250_000_000, matrix_types=(("F16", 48),))
        self.info = fake_model_info(124_000_000)


@pytest.fixture
def templateless_engine(worker_options):
    worker_options.update(engine_factory=_TemplatelessEngine, session_factory=lambda engine: SimpleNamespace(),
                          check_loadable=lambda *_a, **_k: ProbeResult(probed=False, seconds=0.0),
                          default_model=lambda: Path("/models/bare.gguf"))


def _open_template_dialog(window) -> ModelInfoDialog:
    assert window.menus.template_action.isEnabled()
    window.menus.template_action.trigger()
    dialog = window.findChild(ModelInfoDialog)
    assert dialog is not None and dialog.isVisible()
    return dialog


def test_a_model_without_a_chat_template_says_so_in_the_status_bar_and_the_template_dialog(
    qtbot, make_window, templateless_engine
):
    window = make_window()

    assert window.model.template_is_fallback
    # The header's own name ("Bare") is a model's name, not a training tag: shown rather than the file's ("bare").
    assert window.model_label.text() == "Bare · F16 · ctx 1024 · generic chat format"
    tip = window.model_label.toolTip()
    assert FALLBACK_NOTE in tip
    assert "Bare: gpt2, 124M parameters, F16" in tip and "trained on 1,024" in tip

    dialog = _open_template_dialog(window)
    assert dialog.template_note.text() == FALLBACK_NOTE
    assert dialog.template_view.toPlainText() == CHATML_TEMPLATE
    assert _facts(dialog)["File size"] == "250 MB"
    present(dialog.findChild(QDialogButtonBox)).button(QDialogButtonBox.StandardButton.Close).click()
    assert not dialog.isVisible()


class _TemplatelessGemmaEngine(_TemplatelessEngine):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The engine's own rule: no template in the file, and a vocabulary with Gemma's turn markers.
        self.template = ChatTemplate(None, built_in=built_in_format({"<start_of_turn>", "<end_of_turn>"}.__contains__))


def test_a_model_without_a_template_whose_vocabulary_is_gemmas_says_gemmas_format_is_used(
    qtbot, make_window, worker_options
):
    worker_options.update(engine_factory=_TemplatelessGemmaEngine, session_factory=lambda engine: SimpleNamespace(),
                          check_loadable=lambda *_a, **_k: ProbeResult(probed=False, seconds=0.0),
                          default_model=lambda: Path("/models/bare.gguf"))
    window = make_window()

    assert window.model.template_is_fallback and window.model.template_format == "Gemma"
    assert window.model_label.text() == "Bare · F16 · ctx 1024 · Gemma chat format"
    dialog = _open_template_dialog(window)
    note = dialog.template_note.text()
    assert "no chat template" in note and "Gemma's turn markers" in note and note != FALLBACK_NOTE
    assert note in window.model_label.toolTip()
    assert dialog.template_view.toPlainText() == GEMMA_TEMPLATE


def test_the_template_action_waits_for_a_model(qtbot, app_home, dialogs):
    from app.main_window import MainWindow
    from tests.helpers.app_fixtures import quick_settings

    window = MainWindow(quick_settings(), load_model=False)
    qtbot.addWidget(window)
    try:
        (model_menu,) = [a.menu() for a in window.menuBar().actions() if a.text() == "&Model"]
        assert isinstance(model_menu, QMenu)
        assert window.menus.template_action in model_menu.actions()
        assert not window.menus.template_action.isEnabled()
        window.menus.template_action.trigger()  # a disabled action does nothing
        assert window.findChild(ModelInfoDialog) is None
    finally:
        window.close()


@pytest.mark.model
def test_the_bundled_model_shows_its_own_template_and_its_header_facts(qtbot, make_window, model_path):
    window = make_window()

    assert not window.model.template_is_fallback
    # Its header's name is a training tag ("Smollm2 135M 8k Lc100K Mix1 Ep2"): the file's name is shown instead.
    assert window.model_label.text().startswith("SmolLM2-135M-Instruct.Q4_1 · ctx "), "the name says Q4_1 already"
    assert "generic" not in window.model_label.text()
    assert FALLBACK_NOTE not in window.model_label.toolTip()
    dialog = _open_template_dialog(window)
    assert dialog.template_note.text() == OWN_TEMPLATE_NOTE
    source = dialog.template_view.toPlainText()
    assert "<|im_start|>" in source and source != CHATML_TEMPLATE  # SmolLM2's own, with its default system prompt
    facts = _facts(dialog)
    assert (facts["Architecture"], facts["Quantisation"], facts["Trained context"]) == ("llama", "Q4_1", "8,192 tokens")
    assert facts["Parameters"] == "135M"
    assert facts["Name in the file"] == "Smollm2 135M 8k Lc100K Mix1 Ep2"  # a training tag: not the title
    assert dialog.name_label.text() == "SmolLM2-135M-Instruct.Q4_1"
    assert 'SmolLM2-135M-Instruct.Q4_1 (named “Smollm2 135M 8k Lc100K Mix1 Ep2” in the file): llama' in (
        window.model_label.toolTip())
    assert facts["File size"] == plain_size(Path(model_path).stat().st_size)
    assert facts["Context in use"] == f"{window.model.n_ctx:,} tokens"
    # which kernel multiplies a batch by each weight type here: the bundled model's matrices are Q4_1 (and Q8_0)
    kernels = facts["Batch kernels"].splitlines()
    assert kernels and kernels[0].startswith("Q4_1 (") and all(" (" in line and "; " in line for line in kernels)


@pytest.mark.qt_log_ignore(r"This plugin does not support propagateSizeHints\(\)")
def test_a_hybrid_model_says_it_gets_drafts_only_in_the_panel_model_info_and_library(make_window, qtbot, tmp_path):
    from app.widgets.library import LibraryDialog
    from app.widgets.model_info import ModelInfoDialog
    from engine.library.names import DRAFTS_ONLY_NOTE
    from tests.helpers.app_fixtures import MODEL_LOAD_TIMEOUT_MS, quick_settings
    from tests.helpers.tiny_models import write_tiny_hybrid

    folder = tmp_path / "models"
    folder.mkdir()
    path = str(write_tiny_hybrid("lfm2", folder / "tiny-lfm2.gguf"))
    window = make_window(quick_settings())
    window.measure_status.skip()
    window.modelChanged.connect(lambda _model: window.measure_status.skip())
    with qtbot.waitSignal(window.modelChanged, timeout=MODEL_LOAD_TIMEOUT_MS):
        window.load_model(path)
    assert window.model.lookahead_kind == "drafts only" and window.model.lookahead_block_reason is None
    panel = window.panel
    assert panel.lookahead.block_label.text() == DRAFTS_ONLY_NOTE and not panel.lookahead.block_label.isHidden()
    assert panel.lookahead.lookahead_check.isEnabled()  # lookahead stays on: only its window is left out
    window.menus.template_action.trigger()
    info = window.findChild(ModelInfoDialog)
    assert info is not None and info.facts["Lookahead"].text() == DRAFTS_ONLY_NOTE
    library = LibraryDialog([str(folder)], loaded_path=path)
    qtbot.addWidget(library)
    library.show()
    with qtbot.waitSignal(library.scanned, timeout=30_000):
        pass
    cells = [library.model.item(r, c).text() for r in range(library.model.rowCount())
             for c in range(library.model.columnCount())]
    assert "drafts only" in cells
