"""Lookahead on hybrid memory (LFM2, Qwen3.5): one draft per step, its rejected tail taken back.

Tiny random-weight models of each architecture (tests/helpers/tiny_models.py): their text is noise, which is what a
test of equality needs: drafts from the prompt and the reply land sometimes and fail often, so steps accept
whole drafts, parts of drafts and nothing, and every take-back kind is run. Auto plans on the flat curve, where
it drafts whenever it has a draft, so the comparison goes through verified drafts on any CPU.
"""

from __future__ import annotations

import threading

import pytest

from engine import Engine, GenerationControls, LookaheadConfig, Message, SamplingConfig, StopConfig
from engine.costs.exactness import probe_exact_batch
from engine.decoding.session import ChatSession
from engine.llama.models import ROLLBACK_TOKENS
from tests.helpers.planning import FLAT, auto_on_curve
from tests.helpers.tiny_models import write_tiny_hybrid

ARCHS = ("lfm2", "qwen35")

# Twenty prompts of different kinds: repeats the drafts can copy, lists, code, prose, numbers, mixed scripts.
PROMPTS = [
    "hello world hello world hello world",
    "abc abc abc abc abc",
    "the cat sat on the mat and the cat sat on the",
    "1 2 3 4 5 6 7 8 9 10 11 12",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "Monday, Tuesday, Wednesday, Thursday, Friday",
    "Summarise: the quick brown fox jumps over the lazy dog.",
    "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(j)\n",
    "Name three colours.",
    "red green blue red green blue red green",
    "SELECT name FROM users WHERE id = 1; SELECT name FROM users WHERE id = 2;",
    "Write a haiku about rain.",
    "aaaaaaaaaaaaaaaaaaaa",
    "Guten Tag, wie geht es dir? Guten Tag!",
    "<html><body><p>hi</p><p>hi</p></body></html>",
    "What is 2 + 2? What is 3 + 3? What is 4 + 4?",
    "x = [1, 2, 3]\ny = [1, 2, 3]\nz = [1, 2, 3]\n",
    "Once upon a time there was a",
    "yes no yes no yes no yes no",
    "- item one\n- item two\n- item three\n- item",
]


@pytest.fixture(scope="module", params=ARCHS)
def hybrid(request, tmp_path_factory):
    path = write_tiny_hybrid(request.param, tmp_path_factory.mktemp("hybrid") / f"tiny-{request.param}.gguf")
    engine = Engine(path, n_ctx=1024, n_threads=2)
    engine.keep_replies = False
    yield engine
    engine.close()


def tokens_of(events) -> list[int]:
    return [t for e in events for t in e.token_ids]


def generate(engine: Engine, prompt: list[int], lookahead, sampling=SamplingConfig(), max_tokens=80, cancel=None):
    engine.reset()
    controls = GenerationControls(lookahead=lookahead, cancel=cancel or threading.Event())
    return list(engine.generate(prompt, controls, sampling=sampling, stop=StopConfig(max_tokens=max_tokens)))


def test_a_hybrid_model_verifies_one_draft_per_step_with_states_kept_to_take_back(hybrid):
    assert hybrid.info.hybrid and hybrid.drafts_only and hybrid.lookahead_block_reason is None
    assert hybrid.rollback == ROLLBACK_TOKENS and hybrid.lookahead_kind == "drafts only"
    assert hybrid.loaded.commit_seqs == (0,)


def test_the_probe_checks_every_batch_size_and_each_take_back(hybrid):
    # Q4_1 batches give 1-token results here; each size's batch starts after the last one's take-back, so a
    # wrong restored state would show as a mismatch.
    assert probe_exact_batch(hybrid) == ROLLBACK_TOKENS + 1
    assert hybrid.costs.threads_agree is True
    assert hybrid.kv.n == 0


def test_lookahead_writes_plain_decodings_text_on_twenty_prompts_greedy_and_seeded(hybrid):
    drafted = accepted = partly = 0
    with auto_on_curve(hybrid, FLAT):
        for i, text in enumerate(PROMPTS):
            prompt = hybrid.tokenize(text, add_special=True)
            sampling = SamplingConfig() if i % 2 == 0 else SamplingConfig(temperature=0.9, seed=i)
            plain = generate(hybrid, prompt, None, sampling)
            events = generate(hybrid, prompt, LookaheadConfig(auto=True), sampling)
            assert tokens_of(events) == tokens_of(plain), text
            assert all(e.window == 0 and e.guesses <= 1 for e in events)
            assert max(e.batch_size for e in events) <= 1 + ROLLBACK_TOKENS
            drafted += sum(e.n_drafted for e in events)
            accepted += sum(e.n_accepted for e in events)
            partly += sum(0 < e.n_accepted < e.n_drafted for e in events)
    assert drafted > 100 and 0 < accepted < drafted and partly > 0  # whole, partial and no acceptance ran


def test_a_long_reply_past_256_cached_tokens_and_a_fixed_setting_stay_exact(hybrid):
    prompt = hybrid.tokenize(PROMPTS[4] * 3, add_special=True)
    plain = tokens_of(generate(hybrid, prompt, None, max_tokens=400))
    assert len(prompt) + len(plain) > 300
    with auto_on_curve(hybrid, FLAT):
        assert tokens_of(generate(hybrid, prompt, LookaheadConfig(auto=True), max_tokens=400)) == plain
    fixed = generate(hybrid, prompt, LookaheadConfig(window=5, ngram=6, guesses=5), max_tokens=400)
    assert tokens_of(fixed) == plain  # the window and other guesses are left out, the text is the same
    assert all(e.window == 0 for e in fixed) and any(e.n_drafted for e in fixed)


def test_a_reply_stopped_midway_then_regenerated_and_a_chat_that_continues(hybrid):
    messages = [Message("user", PROMPTS[2])]
    prompt = hybrid.render_chat(messages)
    plain = tokens_of(generate(hybrid, prompt, None, max_tokens=60))
    with auto_on_curve(hybrid, FLAT):
        cancel = threading.Event()
        stopped: list[int] = []
        hybrid.reset()
        for ev in hybrid.generate(prompt, GenerationControls(lookahead=LookaheadConfig(auto=True), cancel=cancel),
                                  stop=StopConfig(max_tokens=60)):
            stopped.extend(ev.token_ids)
            if len(stopped) >= 20:
                cancel.set()
        assert 20 <= len(stopped) < len(plain) and stopped == plain[: len(stopped)]
        # Regenerate: the cache still holds the stopped reply's prompt; the same prompt again from there.
        events = list(hybrid.generate(prompt, GenerationControls(lookahead=LookaheadConfig(auto=True)),
                                      stop=StopConfig(max_tokens=60)))
        assert tokens_of(events) == plain
        # The chat goes on: a second turn after the first reply, drafted and verified the same way.
        session = ChatSession(hybrid)
        first = "".join(e.text for e in session.reply(messages, stop=StopConfig(max_tokens=40)))
        turn = [*messages, Message("assistant", first), Message("user", PROMPTS[3])]
        with_lookahead = "".join(e.text for e in session.reply(
            turn, GenerationControls(lookahead=LookaheadConfig(auto=True)), stop=StopConfig(max_tokens=60)))
    hybrid.reset()
    plain_text = "".join(e.text for e in ChatSession(hybrid).reply(turn, stop=StopConfig(max_tokens=60)))
    assert with_lookahead == plain_text


def test_the_library_and_the_engine_name_the_same_kind_of_lookahead(hybrid):
    from engine.library.names import lookahead_kind

    assert lookahead_kind(hybrid.summary.architecture) == hybrid.lookahead_kind == "drafts only"


def test_engine_tune_says_how_far_such_a_model_was_probed_and_that_it_has_no_window(hybrid, capsys, monkeypatch,
                                                                                     tmp_path):
    from engine.tools.cli import main

    monkeypatch.setenv("LOOKAHEAD_CHAT_HOME", str(tmp_path))
    monkeypatch.setenv("LOOKAHEAD_COST_CURVE", "flat")  # the probe runs, the costs are pinned: quick on any PC
    assert main(["tune", "--model", str(hybrid.summary.path), "--threads", "1", "--ctx", "1024"]) == 0
    out = capsys.readouterr().out
    assert f"batches up to {ROLLBACK_TOKENS + 1} tokens (all sizes probed)" in out
    assert f"verifies one draft of up to {ROLLBACK_TOKENS} tokens per step" in out and "Jacobi window would" not in out
