"""Replayed drafts (engine/decoding/replay.py): plain's recorded reply offered back, right at a set share of positions.

The drafts are checked alone, then through ``engine bench --replay`` on a tiny hybrid model with random
weights, the kind of model a replay is for: Auto plans on the flat curve, where it drafts whenever it has a
draft, so the replayed drafts are verified on any CPU.
"""

from __future__ import annotations

import pytest

from engine.decoding.replay import REPLAY_MATCH, ReplayDrafts
from engine.decoding.settings import LookaheadConfig
from engine.speed.workloads import load_workloads
from engine.tools.bench import run_bench
from engine.tools.cli import main
from tests.helpers.planning import FLAT, auto_on_curve
from tests.helpers.tiny_models import write_tiny_hybrid

PROMPT = [5, 6, 7]
REPLY = list(range(100, 400))


def test_a_right_draft_is_the_recorded_continuation_and_a_wrong_one_differs_at_its_first_token():
    drafts = ReplayDrafts(PROMPT, REPLY, right=0.5, n_vocab=1000, seed=3)
    for pos in range(len(REPLY) - 10):
        (d,) = drafts.propose(PROMPT + REPLY[:pos], 10)
        assert d.tokens[1:] == tuple(REPLY[pos + 1 : pos + 10]) and d.match == REPLAY_MATCH
        assert (d.tokens[0] == REPLY[pos]) == drafts.is_right(pos)
        assert drafts.propose(PROMPT + REPLY[:pos], 10) == [d]  # asked again, the same answer
    share = sum(drafts.is_right(pos) for pos in range(len(REPLY))) / len(REPLY)
    assert 0.4 < share < 0.6


def test_the_share_of_right_drafts_follows_the_setting_and_the_ends_are_exact():
    for right in (0.0, 1.0):
        drafts = ReplayDrafts(PROMPT, REPLY, right=right, n_vocab=1000)
        assert {drafts.is_right(pos) for pos in range(len(REPLY))} == {bool(right)}
    share = sum(ReplayDrafts(PROMPT, REPLY, 0.6, 1000).is_right(p) for p in range(len(REPLY))) / len(REPLY)
    assert 0.5 < share < 0.7
    with pytest.raises(ValueError, match="between 0 and 1"):
        ReplayDrafts(PROMPT, REPLY, right=1.5, n_vocab=1000)


def test_nothing_is_offered_once_the_reply_has_left_the_recording_or_run_past_it():
    drafts = ReplayDrafts(PROMPT, REPLY, right=1.0, n_vocab=1000)
    assert drafts.propose(PROMPT + REPLY[:4] + [9], 5) == []  # a reply that went another way
    assert drafts.propose(PROMPT + REPLY, 5) == []  # nothing recorded after the end
    assert drafts.propose(PROMPT[:2], 5) == []  # the prompt is not yet read
    assert drafts.propose(PROMPT + REPLY[:-2], 5)[0].tokens == tuple(REPLY[-2:])  # the end, cut short
    assert not drafts.holds(PROMPT)


def test_a_wrong_draft_stays_inside_the_vocabulary():
    drafts = ReplayDrafts([1], [999, 5], right=0.0, n_vocab=1000)
    assert drafts.propose([1], 2)[0].tokens == (998, 5)


@pytest.fixture(scope="module")
def tiny_lfm2(tmp_path_factory):
    from engine import Engine

    path = write_tiny_hybrid("lfm2", tmp_path_factory.mktemp("replay") / "tiny-lfm2.gguf")
    with Engine(path, n_ctx=1024, n_threads=2) as engine:
        yield engine


@pytest.mark.parametrize("right", [1.0, 0.0])
def test_bench_replays_plain_s_reply_as_drafts_and_the_text_stays_plain_s(tiny_lfm2, right):
    workloads = load_workloads()[:2]
    with auto_on_curve(tiny_lfm2, FLAT):
        report = run_bench(tiny_lfm2, workloads, LookaheadConfig(auto=True), max_tokens=48, replay=right)
    summary = report.summary()
    assert summary["identical"] == 2 and report.replay == right
    replayed = summary["accepted_by_source"].get("replay", 0)
    assert summary["drafted_steps"] > 0
    if right:  # every replayed draft lands whole: steps commit many tokens
        assert replayed > 48 and summary["tokens_per_step"] > 2
    else:
        assert replayed == 0
    assert tiny_lfm2.documents is None  # the replay ends with the bench
    assert "replayed from plain decoding's reply, right at" in report.table()


def test_the_cli_refuses_a_share_of_right_drafts_outside_0_to_1(capsys):
    assert main(["bench", "--replay", "1.5", "--only", "chat-hello"]) != 0
    assert "--replay is the share of right drafts, from 0 to 1, not 1.5" in capsys.readouterr().err
