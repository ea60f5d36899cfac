"""Top-k, min-p, the repeat penalty, DRY and stop strings: lookahead keeps the text exact, the panel passes them on."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from app.requests import GenerationRequest
from app.settings import AppSettings
from app.store import ChatStore
from app.widgets.decoding_panel import DecodingPanel, format_stop_strings, parse_stop_strings
from engine import GenerationControls, LookaheadConfig, Message, RunStats, SamplingConfig, StepEvent, StopConfig
from engine.decoding.settings import DEFAULT_LOOKAHEAD
from engine.llama.problems import SettingsError
from engine.speed.workloads import load_workloads
from tests.helpers.app_fixtures import quick_settings, use_fake_engine
from tests.helpers.planning import FLAT, auto_on_curve

WORKLOADS = [w for w in load_workloads() if not w.attach]  # questions about attached files: test_engine_model
FIXED = LookaheadConfig(window=2, ngram=3, guesses=2)
MAX_TOKENS = 64

# Each new control on its own, at settings where it changes what is drawn, with a fixed seed.
CONTROLS = {
    "top_k": SamplingConfig(temperature=0.9, top_k=8, top_p=1.0, min_p=0.0, seed=11),
    "min_p": SamplingConfig(temperature=0.9, top_k=0, top_p=1.0, min_p=0.08, seed=12),
    "repeat_penalty": SamplingConfig(temperature=0.9, seed=13, repeat_penalty=1.3, repeat_last_n=64),
    "repeat_penalty_greedy": SamplingConfig(temperature=0.0, repeat_penalty=1.3, repeat_last_n=64),
    "dry": SamplingConfig(temperature=0.0, dry_multiplier=0.8),
    "dry_sampled_prompt": SamplingConfig(temperature=0.8, seed=14, dry_multiplier=0.8, dry_last_n=256),
}


def run(engine, prompt, lookahead, sampling, stop=()):
    key = (tuple(prompt), sampling, stop)
    if lookahead is None and not stop and key in _plain_runs:
        return _plain_runs[key]
    engine.reset()
    summary = RunStats()
    for ev in engine.generate(prompt, GenerationControls(lookahead=lookahead), sampling=sampling,
                              stop=StopConfig(max_tokens=MAX_TOKENS, stop_strings=tuple(stop))):
        summary.observe(ev)
    if lookahead is None and not stop:
        _plain_runs[key] = summary
    return summary


# Plain runs are the reference of several tests: each is decoded once per session.
_plain_runs: dict[tuple, RunStats] = {}


def chat_prompt(engine, workload):
    return engine.render_chat([Message("user", workload.prompt)])


# --- the engine: exact under each control ---


@pytest.mark.model
@pytest.mark.parametrize("control", CONTROLS, ids=str)
def test_lookahead_samples_the_same_text_as_plain_decoding_with_each_control(engine, control):
    sampling = CONTROLS[control]
    differ = []
    accepted = {"auto": 0, "fixed": 0}
    # Each control on every fourth workload, each workload under one control: a control takes the same path
    # through the sampler whatever the prompt, and every prompt is still sampled with lookahead once.
    k = list(CONTROLS).index(control)
    for w in WORKLOADS[k :: len(CONTROLS)]:
        prompt = chat_prompt(engine, w)
        plain = run(engine, prompt, None, sampling)
        with auto_on_curve(engine, FLAT):  # Auto drafts whenever it has a draft, on any CPU
            auto = run(engine, prompt, DEFAULT_LOOKAHEAD, sampling)
        for name, la in (("auto", auto), ("fixed", run(engine, prompt, FIXED, sampling))):
            accepted[name] += la.n_accepted
            if la.token_ids != plain.token_ids or la.text != plain.text:
                differ.append(f"{w.id} ({name})")
    assert not differ, f"{control}: lookahead text differs from plain on {differ}"
    # Drafts were verified and kept: the equality is not that of two plain runs.
    assert accepted["auto"] > 0 and accepted["fixed"] > 0, accepted


def penalised_greedy_by_hand(engine, prompt, penalty, last_n, n_tokens):
    """The greedy reply under a repeat penalty, from one-token decodes and numpy (llama.cpp's rule:
    a positive logit is divided by the penalty, a negative one multiplied; the window holds the prompt's tail)."""
    engine.reset()
    engine.cache.cache_prompt(prompt)
    tokens = list(prompt)
    reply: list[int] = []
    while len(reply) < n_tokens:
        loaded = engine.loaded
        loaded.batch.set_single_seq([tokens[-1]], len(tokens) - 1, loaded.commit_seqs, last_logits=True)
        engine.ctx.decode(loaded.batch)
        row = engine.ctx.logits_rows(1)[0].copy()
        seen = np.unique(tokens[-last_n:])
        row[seen] = np.where(row[seen] > 0, row[seen] / np.float32(penalty), row[seen] * np.float32(penalty))
        tok = int(np.argmax(row))
        reply.append(tok)
        tokens.append(tok)
        if engine.model.is_eog(tok):
            break
    engine.reset()
    return reply


@pytest.mark.model
def test_greedy_with_a_repeat_penalty_is_the_argmax_of_the_penalised_logits(engine):
    """Every drawn token enters the penalty's window once, in order, after the prompt's tail."""
    sampling = CONTROLS["repeat_penalty_greedy"]
    for w in WORKLOADS[:3]:
        prompt = chat_prompt(engine, w)
        expected = penalised_greedy_by_hand(engine, prompt, sampling.repeat_penalty, sampling.repeat_last_n,
                                            MAX_TOKENS)
        assert run(engine, prompt, None, sampling).token_ids == expected, w.id
        assert run(engine, prompt, FIXED, sampling).token_ids == expected, w.id


@pytest.mark.model
def test_the_repeat_penalty_changes_the_text(engine):
    changed = []
    for w in WORKLOADS[:6]:
        prompt = chat_prompt(engine, w)
        off = run(engine, prompt, None, SamplingConfig())
        on = run(engine, prompt, None, CONTROLS["repeat_penalty_greedy"])
        if on.text != off.text:
            changed.append(w.id)
    assert len(changed) >= 3, changed


@pytest.mark.model
def test_dry_ends_a_loop_that_greedy_decoding_falls_into(engine):
    """Asked to copy a chorus, greedy decoding sings "la la la" until the limit; DRY, which does not count the
    prompt's own repeats against the reply, copies it and reaches the last line."""
    from engine.decoding.loops import reads_as_a_loop

    chorus = "La la la, la la la,\n" * 4 + "sing it all night long."
    prompt = engine.render_chat([Message("user", f"Copy this song chorus exactly, as it is:\n\n{chorus}")])
    greedy = run(engine, prompt, None, SamplingConfig())
    dry = run(engine, prompt, None, CONTROLS["dry"])
    assert reads_as_a_loop(greedy.text) and "night long" not in greedy.text, greedy.text
    assert not reads_as_a_loop(dry.text) and "night long" in dry.text.lower(), dry.text


def test_the_settings_say_what_they_are_in_words():
    assert SamplingConfig().describe(True) == "greedy, loop guard on"
    sampled = SamplingConfig(temperature=0.7, seed=7, top_k=0, top_p=1.0, min_p=0.1, repeat_penalty=1.1)
    assert sampled.describe() == "temperature 0.7, seed 7, min-p 0.1, repeat penalty 1.1 over the last 64 tokens"
    assert SamplingConfig(dry_multiplier=0.8).describe(False) == \
        "greedy, DRY 0.8 (base 1.75, 2 tokens free) over the reply, loop guard off"
    both = SamplingConfig(repeat_penalty=1.1, repeat_last_n=32, dry_multiplier=0.8)  # one history: DRY sees 32 too
    assert both.prompt_tail == 32 and both.describe().endswith("over the reply and the prompt's last 32 tokens")


@pytest.mark.model
def test_top_k_of_one_samples_the_greedy_text(engine):
    """top-k reaches the sampler: with k=1 every temperature draws the argmax."""
    prompt = chat_prompt(engine, WORKLOADS[0])
    greedy = run(engine, prompt, None, SamplingConfig())
    hot = SamplingConfig(temperature=1.5, top_k=1, seed=5)
    assert run(engine, prompt, None, hot).token_ids == greedy.token_ids
    assert run(engine, prompt, None, SamplingConfig(temperature=1.5, seed=5)).token_ids != greedy.token_ids


@pytest.mark.auto
@pytest.mark.model
def test_stop_strings_cut_the_text_at_the_same_place_in_both_modes(engine):
    sampling = CONTROLS["top_k"]
    cut = 0
    workloads = WORKLOADS[:: len(CONTROLS)] + WORKLOADS[1 :: len(CONTROLS)]  # top-k's own first: plain runs shared
    for w in workloads:
        prompt = chat_prompt(engine, w)
        full = run(engine, prompt, None, sampling).text
        # A stop string from the reply itself, so the cut is known: just before its first occurrence.
        stop = full[len(full) // 2 : len(full) // 2 + 3]
        if not stop.strip():
            continue
        expected = full[: full.find(stop)]
        stops = (stop, "never in any reply §§")
        plain = run(engine, prompt, None, sampling, stops)
        assert plain.text == expected and plain.stop_reason == "stop_string", w.id
        for shape in (DEFAULT_LOOKAHEAD, FIXED):
            la = run(engine, prompt, shape, sampling, stops)
            assert la.text == expected and la.stop_reason == "stop_string", f"{w.id} {shape}"
            assert la.token_ids == plain.token_ids, f"{w.id} {shape}: tokens past the stop string"
        cut += 1
    assert cut >= len(workloads) // 2


# --- settings ---


@pytest.mark.parametrize("bad", [
    SamplingConfig(top_k=-1), SamplingConfig(top_k=100_000), SamplingConfig(min_p=1.0),
    SamplingConfig(repeat_penalty=0.9), SamplingConfig(repeat_penalty=2.5), SamplingConfig(repeat_penalty=float("nan")),
    SamplingConfig(dry_multiplier=-0.1), SamplingConfig(dry_multiplier=9.0), SamplingConfig(dry_base=1.0),
    SamplingConfig(dry_allowed_length=0), SamplingConfig(dry_last_n=-1),
    SamplingConfig(repeat_last_n=-1), SamplingConfig(repeat_last_n=5000), SamplingConfig(temperature=float("nan")),
], ids=["top_k<0", "top_k huge", "min_p=1", "penalty<1", "penalty>2", "penalty nan", "dry<0", "dry huge",
        "dry base 1", "dry free 0", "dry prompt<0", "window<0", "window huge",
        "temperature nan"])
def test_out_of_range_sampling_settings_are_refused(bad):
    with pytest.raises(SettingsError):
        bad.validate()


def test_the_sampler_chain_is_skipped_only_when_nothing_changes_the_logits():
    assert SamplingConfig().plain_argmax
    assert SamplingConfig(repeat_penalty=1.5, repeat_last_n=0).plain_argmax  # a window of 0 is off
    assert not SamplingConfig(repeat_penalty=1.1).plain_argmax
    assert not SamplingConfig(temperature=0.5).plain_argmax


def test_stop_strings_are_typed_one_per_line_with_escapes():
    text = "###\n\\n\\nUser:\n\nback\\\\slash\ttab\\t"
    stops = parse_stop_strings(text)
    assert stops == ["###", "\n\nUser:", "back\\slash\ttab\t"]
    assert parse_stop_strings(format_stop_strings(stops)) == stops


# --- the panel ---


def test_the_sampling_group_keeps_each_control_within_the_engine_limits(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    for spin, whole in ((panel.top_k_spin, -5), (panel.repeat_last_n_spin, 10**6)):
        spin.setValue(whole)
    for double_spin, value in ((panel.min_p_spin, 3.0), (panel.repeat_penalty_spin, 0.2)):
        double_spin.setValue(value)
    panel.repeat_penalty_spin.setValue(9.0)
    panel.sampling_config().validate()
    assert panel.top_k_spin.value() == 0 and panel.repeat_last_n_spin.value() == 4096
    assert panel.repeat_penalty_spin.value() == 2.0 and panel.min_p_spin.value() < 1.0


def set_panel(panel: DecodingPanel) -> None:
    panel.temperature_spin.setValue(0.7)
    panel.top_k_spin.setValue(12)
    panel.top_p_spin.setValue(0.8)
    panel.min_p_spin.setValue(0.1)
    panel.repeat_penalty_spin.setValue(1.15)
    panel.repeat_last_n_spin.setValue(128)
    panel.dry_spin.setValue(1.2)
    panel.seed_spin.setValue(99)
    panel.max_tokens_spin.setValue(20)
    panel.stop_edit.setPlainText("###\n\\n\\n")


PANEL_SAMPLING = SamplingConfig(temperature=0.7, top_k=12, top_p=0.8, min_p=0.1, seed=99, repeat_penalty=1.15,
                                repeat_last_n=128, dry_multiplier=1.2)
PANEL_STOP = StopConfig(max_tokens=20, stop_strings=("###", "\n\n"), loop_guard=True)  # the guard: on by default


def test_the_panel_remembers_the_new_controls_in_the_app_settings(qtbot):
    panel = DecodingPanel()
    qtbot.addWidget(panel)
    set_panel(panel)
    saved = AppSettings()
    panel.store_settings(saved)
    assert (saved.top_k, saved.min_p, saved.repeat_penalty, saved.repeat_last_n) == (12, 0.1, 1.15, 128)
    assert saved.stop_strings == ["###", "\n\n"]
    again = DecodingPanel()
    qtbot.addWidget(again)
    again.load_settings(saved)
    assert again.sampling_config() == PANEL_SAMPLING and again.stop_config() == PANEL_STOP


class _RecordingSession:
    """Answers "ok" in one step and keeps the sampling and stop settings each reply was asked with."""

    asked: list[tuple[SamplingConfig, StopConfig]] = []

    def __init__(self, engine) -> None:
        self.engine = engine

    def reply(self, messages, controls, sampling=None, stop=None, drafts_from=()):
        self.asked.append((sampling, stop))
        return iter([StepEvent(step=0, mode="plain", token_ids=(1,), text="ok", n_committed=1, batch_size=1,
                               n_logits=1, n_drafted=0, n_accepted=0, n_reevaluated=0, window=0, ngram=0, guesses=0,
                               elapsed_s=0.001, decode_s=0.001, stop_reason="max_tokens", token_texts=("ok",),
                               token_sources=("own",))])


@pytest.fixture
def recording_engine(worker_options):
    _RecordingSession.asked = []
    use_fake_engine(worker_options, _RecordingSession)
    return _RecordingSession


def test_values_set_in_the_panel_reach_the_request_and_are_saved_with_the_chat(qtbot, make_window, recording_engine):
    window = make_window(quick_settings())
    set_panel(window.panel)
    requests: list[GenerationRequest] = []
    window.engine.generateRequested.connect(requests.append)
    window.input.setPlainText("hello")
    with qtbot.waitSignal(window.replyCompleted, timeout=10_000) as done:
        window.send_button.click()
    assert (requests[0].sampling, requests[0].stop) == (PANEL_SAMPLING, PANEL_STOP)
    assert recording_engine.asked == [(PANEL_SAMPLING, PANEL_STOP)]  # what the engine was asked with
    saved = window.store.conversation_settings(done.args[0].conversation_id)
    assert saved == window.panel.chat_settings()
    assert saved["stop_strings"] == ["###", "\n\n"] and saved["repeat_penalty"] == 1.15


def test_opening_a_chat_shows_the_sampling_values_it_was_saved_with(qtbot, app_home):
    from app.main_window import MainWindow

    store = ChatStore()
    tuned = store.create_conversation("Tuned")
    store.set_conversation_settings(tuned.id, {"temperature": 0.7, "top_k": 12, "top_p": 0.8, "min_p": 0.1,
                                               "repeat_penalty": 1.15, "repeat_last_n": 128, "seed": 99,
                                               "dry_multiplier": 1.2,
                                               "max_tokens": 20, "stop_strings": ["###", "\n\n"],
                                               "future_setting": "kept out of the panel"})
    store.create_conversation("Untuned")
    window = MainWindow(quick_settings(temperature=0.3, top_k=40), store, load_model=False)
    qtbot.addWidget(window)
    try:
        assert window.panel.sampling_config().temperature == 0.3  # the open chat saved nothing: as the app was
        window.conversations.list.setCurrentRow(1)
        assert window.current_conversation_id() == tuned.id
        assert window.panel.sampling_config() == PANEL_SAMPLING and window.panel.stop_config() == PANEL_STOP
        window.conversations.list.setCurrentRow(0)  # a chat without settings keeps what the panel shows
        assert window.panel.sampling_config() == PANEL_SAMPLING
        store.set_conversation_settings(tuned.id, {"top_k": "twelve", "seed": True, "min_p": float("nan"),
                                                   "temperature": 1})
        window.conversations.list.setCurrentRow(1)  # wrong types are ignored, an int is a fine float
        assert window.panel.sampling_config() == replace(PANEL_SAMPLING, temperature=1.0)
    finally:
        window.close()
        store.close()


@pytest.mark.model
def test_an_open_chat_keeps_its_values_when_a_model_with_its_own_settings_loads(qtbot, app_home, make_window):
    from engine import default_model_path

    store = ChatStore()
    tuned = store.create_conversation("Tuned")
    store.set_conversation_settings(tuned.id, {"temperature": 0.7, "top_k": 12})
    store.close()
    settings = quick_settings(per_model={str(default_model_path()): {"temperature": 0.3, "top_k": 5, "seed": 8}})
    window = make_window(settings)  # opens the chat, then loads the model and its remembered values
    assert window.current_conversation_id() == tuned.id
    sampling = window.panel.sampling_config()
    assert (sampling.temperature, sampling.top_k, sampling.seed) == (0.7, 12, 8)
