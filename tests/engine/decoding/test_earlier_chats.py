"""Drafts from beyond one reply: earlier chats with the same model, and the n-gram pool kept per model file."""

from __future__ import annotations

import os
import shutil

import pytest

from engine import Engine, GenerationControls, Message, RunStats, StopConfig
from engine.costs.curve import DEFAULT_CURVE
from engine.decoding.drafts import CorpusIndex
from engine.decoding.settings import DEFAULT_LOOKAHEAD, LookaheadConfig
from engine.speed.workloads import load_workloads
from engine.tools.bench import workload_prompt
from tests.helpers.planning import FLAT, STEEP, auto_on_curve, laptop_curve

pytestmark = pytest.mark.model


def _reply(engine, prompt, lookahead, max_tokens=96, fresh=True) -> RunStats:
    """One reply; ``fresh=False`` keeps the cached prefix of ``prompt``, as a chat's next reply does."""
    if fresh:
        engine.reset()
    return RunStats.of(engine.generate(prompt, GenerationControls(lookahead=lookahead),
                                       stop=StopConfig(max_tokens=max_tokens)))


@pytest.fixture
def earlier_chats_engine(engine):
    """The shared engine with empty drafts-from-earlier-chats, put back as it was afterwards."""
    saved = engine.corpus, engine.kept, engine.keep_replies
    engine.corpus = CorpusIndex()
    yield engine
    engine.corpus, engine.kept, engine.keep_replies = saved


def test_a_reply_drafts_from_an_earlier_chat_with_the_same_model(earlier_chats_engine):
    engine = earlier_chats_engine
    prompt = engine.render_chat([Message("user", "Write a haiku about autumn leaves, then explain it briefly.")])
    first = _reply(engine, prompt, None)
    # That chat is over; a new one asks the same. Its reply is nowhere in the new prompt, only in the earlier chat.
    engine.remember_chat(engine.tokenize("Write a haiku about autumn leaves, then explain it briefly.",
                                         add_special=False) + first.token_ids)
    with auto_on_curve(engine, DEFAULT_CURVE):  # what Auto drafts, not what this CPU makes worth it
        again = _reply(engine, prompt, DEFAULT_LOOKAHEAD)
    assert again.token_ids == first.token_ids
    assert again.accepted_by_source.get("other_chats", 0) > 20, again.accepted_by_source
    engine.corpus = CorpusIndex()  # what a different model's engine starts with: nothing from this chat
    alone = _reply(engine, prompt, DEFAULT_LOOKAHEAD)
    assert "other_chats" not in alone.accepted_by_source and alone.token_ids == first.token_ids


@pytest.mark.auto
def test_the_kept_pool_survives_a_restart_and_is_dropped_when_the_model_file_changes(model_path, tmp_path):
    copy = tmp_path / "model.gguf"
    shutil.copyfile(model_path, copy)
    prompt_text = "List five fruits, one per line, each with its colour."
    with Engine(copy, n_ctx=1024, n_threads=2) as eng:
        eng.draft_from_earlier_chats()
        assert eng.kept is not None and len(eng.kept) == 0
        prompt = eng.render_chat([Message("user", prompt_text)])
        plain = _reply(eng, prompt, None)
        first = _reply(eng, prompt, DEFAULT_LOOKAHEAD)
        kept = len(eng.kept)
        assert kept > 0
    with Engine(copy, n_ctx=1024, n_threads=2) as eng:  # the app started again
        eng.draft_from_earlier_chats()
        assert eng.kept is not None and len(eng.kept) == kept
        # Fixed G: n-gram drafts are verified whatever the curve (Auto looks them up only where they pay).
        again = _reply(eng, eng.render_chat([Message("user", prompt_text)]), LookaheadConfig(0, 4, 3))
        assert again.token_ids == first.token_ids == plain.token_ids
        assert again.accepted_by_source.get("kept", 0) > 0, again.accepted_by_source
    st = copy.stat()
    os.utime(copy, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # the file was replaced or changed
    with Engine(copy, n_ctx=1024, n_threads=2) as eng:
        eng.draft_from_earlier_chats()
        assert eng.kept is not None and len(eng.kept) == 0


def test_lookahead_equals_plain_on_the_workloads_with_every_draft_source_and_a_what_if_curve(
    earlier_chats_engine, plain_reference
):
    """Each workload's chat is remembered as it ends, so later ones also draft from earlier chats (and from
    attached files). Every other workload is answered again with lookahead, in turn: Auto where batches are dear,
    a fixed shape with both branches, Auto on a laptop's what-if curve and Auto where batches are nearly free;
    the other workloads' equality is test_engine_model's. Every curve is pinned, so Auto plans the same on any
    CPU and CI need not run this again on the reference curves."""
    engine = earlier_chats_engine
    engine.kept = None
    laptop = laptop_curve("laptop-8core-llama3.2-3b-q4_k_m")
    runs = [(DEFAULT_LOOKAHEAD, STEEP), (LookaheadConfig(window=3, ngram=4, guesses=3), None),
            (DEFAULT_LOOKAHEAD, laptop), (DEFAULT_LOOKAHEAD, FLAT)]
    try:
        for i, w in enumerate(load_workloads()):
            with workload_prompt(engine, w, max_tokens=64) as (prompt, _seen):  # attached files drafted from too
                plain = plain_reference.tokens(prompt, 64)
                if i % 2 == 0:
                    shape, curve = runs[(i // 2) % len(runs)]
                    engine.plan_with(curve)
                    la = _reply(engine, prompt, shape, max_tokens=64, fresh=False)
                    assert la.token_ids == plain, (w.id, shape, curve)
            engine.remember_chat(engine.tokenize(w.prompt, add_special=False) + plain)
    finally:
        engine.plan_with(None)


@pytest.fixture
def document_engine(engine):
    """The shared engine drafting from no documents and no earlier chats, put back as it was afterwards."""
    saved = engine.corpus, engine.kept
    engine.corpus = engine.kept = None
    yield engine
    engine.set_documents([])
    engine.corpus, engine.kept = saved


def test_a_reply_drafts_from_an_attached_document_that_is_not_in_its_prompt(document_engine):
    engine = document_engine
    prompt = engine.render_chat([Message("user", "Describe how a bicycle's gears work, step by step.")])
    first = _reply(engine, prompt, None)
    # A document that holds the reply (as a manual would hold the answer), attached but not in the prompt.
    document = "Notes from the workshop.\n\n" + engine.detokenize(first.token_ids) + "\n\nEnd of notes."
    engine.set_documents([document])
    with auto_on_curve(engine, DEFAULT_CURVE):  # what Auto drafts, not what this CPU makes worth it
        again = _reply(engine, prompt, DEFAULT_LOOKAHEAD)
    assert again.token_ids == first.token_ids  # drafts change the speed, never the text
    assert again.accepted_by_source.get("document", 0) > 20, again.accepted_by_source
    engine.set_documents([])
    alone = _reply(engine, prompt, DEFAULT_LOOKAHEAD)
    assert "document" not in alone.accepted_by_source and alone.token_ids == first.token_ids


def test_setting_the_same_documents_again_keeps_their_index_and_an_empty_list_drops_it(document_engine):
    engine = document_engine
    engine.set_documents(["one short document", "and another one here"])
    index = engine.documents
    assert index is not None and index.origin == "document" and len(index) > 6
    engine.set_documents(["one short document", "and another one here"])
    assert engine.documents is index
    engine.set_documents([])
    assert engine.documents is None
