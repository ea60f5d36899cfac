import random

import pytest

from engine.costs.curve import CostCurve, LiveCosts
from engine.decoding.acceptance import OPENING_PRIOR, POOL_PRIOR, AcceptanceStats, bucket
from engine.decoding.auto import (
    SHORT_MATCH,
    AutoPolicy,
    FixedPolicy,
    _best_pick,
    _Estimate,
    _Prices,
    break_even_p,
    expected_tokens,
    least_paying_p,
)
from engine.decoding.drafts import (
    AGREE,
    ALONE,
    ENDING,
    ENDS_NOW,
    FORCED,
    SPLIT,
    CorpusIndex,
    Draft,
    DraftSources,
    HistoryIndex,
)
from engine.decoding.origins import DraftSource
from engine.decoding.plan import StepChoice
from engine.decoding.pool import NgramPool
from engine.decoding.settings import LookaheadConfig

STEEP = CostCurve(sizes=(1, 2, 4, 8, 16, 64), last_logit=(1, 1.7, 2.6, 4.4, 8, 30),
                  all_logits=(1, 1.8, 2.9, 4.8, 9, 32), base_ms=10, threads=2)
# A Q4_1 or tiled-kernel model on 2 cores: a draft pays where each token lands with p >= 0.2 or so.
MID = CostCurve(sizes=(1, 2, 4, 8, 16, 64), last_logit=(1, 1.15, 1.35, 1.9, 3, 9),
                all_logits=(1, 1.2, 1.5, 2.2, 3.5, 11), base_ms=10, threads=2)
FLAT = CostCurve(sizes=(1, 2, 4, 8, 16, 64), last_logit=(1, 1.01, 1.02, 1.04, 1.1, 1.5),
                 all_logits=(1, 1.01, 1.03, 1.05, 1.12, 1.6), base_ms=10, threads=8)
CFG = LookaheadConfig(window=4, ngram=8, guesses=2, auto=True)


def copying_history():
    h = HistoryIndex()
    text = list(range(100, 140))
    h.extend(text + [7] + text[:12])  # the reply is copying the prompt
    return h


def expected_by_hand(stats: AcceptanceStats, d: Draft, sure: bool) -> list[float]:
    """1, 1 + p1, 1 + p1 + p1*p2, ... for the draft's tokens."""
    out, run = [1.0], 1.0
    for k in range(len(d.tokens)):
        run *= stats.p(bucket(d, k, sure))
        out.append(out[-1] + run)
    return out


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    assert expected_tokens(0.0, 5) == 1.0


def test_break_even_acceptance_prices_the_draft_with_the_curve():
    p = break_even_p(STEEP, 1)
    assert expected_tokens(p, 1) == pytest.approx(STEEP.cost(2), abs=1e-4)  # 1 + p = 1.8
    assert break_even_p(FLAT, 1) < 0.05
    dear = CostCurve(sizes=(1, 2), last_logit=(1, 2.5), all_logits=(1, 2.5), base_ms=10, threads=1)
    assert break_even_p(dear, 1) == 1.0


def test_auto_takes_a_plain_step_when_no_draft_pays_for_its_cost():
    h = HistoryIndex()
    h.extend([1, 2, 3, 4, 9, 3])  # only the last token was seen before: a weak match
    choice = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, AcceptanceStats()).choose(3, CFG, room=60)
    assert choice.plain


def test_auto_asks_whether_the_model_was_sure_only_when_it_has_drafts_to_price():
    # The softmax over the vocabulary costs about half a percent of a small model's step: a step with nothing to
    # draft from (most steps of free writing) must not pay it.
    asked = []

    def confidence() -> bool:
        asked.append(1)
        return True

    fresh = HistoryIndex()
    fresh.extend([1, 2, 3, 4])  # the last token was never seen before: no draft
    assert AutoPolicy(DraftSources(fresh, NgramPool(max_len=7)), STEEP, AcceptanceStats()).choose(
        4, CFG, room=60, confidence=confidence).plain
    assert asked == []
    h = copying_history()
    choice = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, AcceptanceStats()).choose(
        h.tokens[-1], CFG, room=60, confidence=confidence)
    assert choice.drafts and asked == [1]


def test_pricing_a_draft_length_by_length_stops_early_yet_picks_what_pricing_every_length_picks():
    rng = random.Random(5)
    curves = [STEEP, MID, FLAT, CostCurve(sizes=(1, 2, 4, 5, 8, 16), last_logit=(1, 1.1, 1.2, 1.6, 1.7, 3),
                                          all_logits=(1, 1.2, 1.3, 1.9, 1.8, 3.5), base_ms=10, threads=2)]
    stopped_early = 0
    for _ in range(3000):
        stats = AcceptanceStats()
        for _ in range(rng.randint(0, 30)):
            d = Draft(tuple(rng.randrange(9) for _ in range(rng.randint(1, 15))), DraftSource.HISTORY,
                      rng.randint(1, 20))
            stats.observe(d, len(d.tokens), rng.randint(0, len(d.tokens)), sure=rng.random() < 0.5)
        drafts = [Draft(tuple(rng.randrange(40) for _ in range(n)), rng.choice(list(DraftSource)), rng.randint(1, 20),
                        tuple(rng.choice((AGREE, ALONE, SPLIT)) for _ in range(n)))
                  for n in (rng.randint(1, 15) for _ in range(rng.randint(1, 4)))]
        curve, sure, trust = rng.choice(curves), rng.random() < 0.5, rng.uniform(0.2, 1.0)
        gain, length, room = rng.choice(((1.0, 0), (1.8, 3))) + (rng.randint(4, 30),)
        firsts = {drafts[0].tokens[0]} if length and len(drafts) > 1 else set()
        prices = _Prices(curve)
        best_rate = gain / prices[1 + length]
        estimates = [_Estimate(d, stats, sure, trust) for d in drafts]
        pick = _best_pick(estimates, gain, length, best_rate, firsts, prices, room)
        want = best_rate  # the best rate over every length of every draft, priced one by one
        for d in drafts:
            if d.tokens[0] in firsts:
                continue
            expected = expected_by_hand(stats, d, sure)
            if d.match < SHORT_MATCH:
                expected = [1.0 + trust * (e - 1.0) for e in expected]
            for L in range(1, min(len(d.tokens), room - length) + 1):
                want = max(want, (gain + expected[L] - 1.0) / prices[1 + length + L])
        assert (pick[2] if pick else best_rate) == pytest.approx(want, rel=1e-12)
        if pick:  # what it picked has the rate it says
            est, L, rate = pick
            assert (gain + est.at(L) - 1.0) / prices[1 + length + L] == pytest.approx(rate, rel=1e-12)
        stopped_early += sum(len(e.draft.tokens) > len(e._values) - 1 for e in estimates)
    assert stopped_early > 1000  # most drafts were priced only as far as a few of their tokens


def test_auto_looks_up_the_kept_n_grams_only_where_their_drafts_could_pay():
    h = HistoryIndex()
    h.extend([5, 6, 7])
    kept = NgramPool(max_len=7)
    kept.add(7, [8, 9, 10])
    looked = []

    class Kept(NgramPool):
        def ranked(self, key, count, length):
            looked.append(key)
            return kept.ranked(key, count, length)

    sources = DraftSources(h, NgramPool(max_len=7), kept=Kept(max_len=7))
    # Kept n-grams land about one time in ten: a draft of them pays on a nearly flat curve, not where a token
    # more costs 0.15 steps (this reply's own n-grams, which land more often, are still looked up there).
    flat = AutoPolicy(sources, FLAT, AcceptanceStats()).choose(7, CFG, room=60)
    assert looked == [7] and flat.drafts[0].source == DraftSource.KEPT
    cheap = CostCurve(sizes=(1, 2, 4, 8, 16, 64), last_logit=(1, 1.12, 1.3, 1.8, 3, 9),
                      all_logits=(1, 1.15, 1.35, 2.0, 3.4, 11), base_ms=10, threads=2)
    policy = AutoPolicy(sources, cheap, AcceptanceStats())
    assert policy.min_p < POOL_PRIOR and policy.choose(7, CFG, room=60).plain
    assert looked == [7]



def test_the_reply_s_first_step_keeps_its_n_gram_drafts_acceptance_apart():
    # The prompt's last token is the chat template's: what followed it elsewhere in the prompt seldom starts a reply.
    h = HistoryIndex()
    h.extend([5, 7, 8, 6, 7])
    pool = NgramPool(max_len=7)
    pool.add_tokens(h.tokens)  # 7 -> (8, 6, 7)
    cheap = CostCurve(sizes=(1, 2, 4, 8, 16, 64), last_logit=(1, 1.12, 1.3, 1.8, 3, 9),
                      all_logits=(1, 1.15, 1.35, 2.0, 3.4, 11), base_ms=10, threads=2)
    later = AutoPolicy(DraftSources(h, pool), cheap, AcceptanceStats()).choose(7, CFG, room=60)
    assert later.drafts and later.drafts[0].source == DraftSource.POOL
    stats = AcceptanceStats()
    assert AutoPolicy(DraftSources(h, pool), cheap, stats).choose(7, CFG, room=60, opening=True).plain
    flat = AutoPolicy(DraftSources(h, pool), FLAT, stats)
    opening = flat.choose(7, CFG, room=60, opening=True)  # where a row costs next to nothing, they are tried
    assert opening.drafts[0].source == DraftSource.OPENING
    flat.observe(opening, [9], "", 0)
    assert stats.p(bucket(opening.drafts[0])) < OPENING_PRIOR  # and learn on their own
    assert stats.p(bucket(later.drafts[0])) == pytest.approx(POOL_PRIOR)

def test_auto_drafts_a_long_match_on_a_steep_curve():
    h = copying_history()
    auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, AcceptanceStats())
    choice = auto.choose(h.tokens[-1], CFG, room=60)
    assert len(choice.drafts) == 1 and choice.window == 0
    assert choice.drafts[0].tokens[:3] == (112, 113, 114)
    assert choice.expected_gain > 1.0


def test_auto_drafts_shorter_once_drafts_stop_landing():
    h = copying_history()
    stats = AcceptanceStats()
    auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, stats)
    before = auto.choose(h.tokens[-1], CFG, room=60)
    for _ in range(30):  # the same kind of draft keeps failing at its first token
        stats.observe(before.drafts[0], len(before.drafts[0].tokens), 0)
    after = auto.choose(h.tokens[-1], CFG, room=60)
    assert after.plain or len(after.drafts[0].tokens) < len(before.drafts[0].tokens)


def test_auto_runs_a_window_only_where_the_curve_is_flat():
    h = HistoryIndex()
    h.extend([1, 2, 3])
    steep = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, AcceptanceStats()).choose(3, CFG, room=60)
    flat = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), FLAT, AcceptanceStats()).choose(3, CFG, room=60)
    assert steep.window == 0
    assert flat.window > 0



def test_the_window_a_step_without_drafts_takes_follows_what_the_live_costs_learn():
    costs = LiveCosts(FLAT)
    auto = AutoPolicy(DraftSources(HistoryIndex(), NgramPool(max_len=7)), costs, AcceptanceStats())
    assert auto.choose(7, CFG, room=60).window > 0  # nearly free rows: the window's columns pay
    assert auto.choose(7, CFG, room=60).window > 0
    for _ in range(LiveCosts.MIN_SINGLES):
        costs.record(1, 1, 0.010)
    for _ in range(6):  # batches turn out to cost three steps here
        costs.record(8, 8, 0.030)
        costs.record(1, 1, 0.010)
    assert auto.choose(7, CFG, room=60).plain

def test_auto_runs_a_window_on_a_dear_curve_once_its_columns_have_earned_their_rows():
    h = HistoryIndex()
    h.extend([1, 2, 3])
    stats = AcceptanceStats()
    assert AutoPolicy(DraftSources(h, NgramPool(max_len=7)), MID, stats).choose(3, CFG, room=60).window == 0
    stats.observe_window(columns=100, landed=80)  # trajectories that kept landing: 0.7 tokens a column
    assert AutoPolicy(DraftSources(h, NgramPool(max_len=7)), MID, stats).choose(3, CFG, room=60).window > 0


def test_a_short_match_in_an_earlier_chat_is_drafted_on_less_than_the_same_match_in_this_reply():
    # The last two tokens (3, 4) were followed by 8, 9, 10 once: in this reply's prompt, or in another chat.
    own = HistoryIndex()
    own.extend([1, 3, 4, 8, 9, 10, 2, 3, 4])
    here = AutoPolicy(DraftSources(own, NgramPool(max_len=7)), MID, AcceptanceStats()).choose(4, CFG, room=60)
    elsewhere = CorpusIndex()
    elsewhere.add([1, 3, 4, 8, 9, 10])
    fresh = HistoryIndex()
    fresh.extend([2, 3, 4])
    there = AutoPolicy(DraftSources(fresh, NgramPool(max_len=7), corpus=elsewhere), MID, AcceptanceStats())
    assert here.drafts and here.drafts[0].tokens[0] == 8
    assert there.sources.matches(4, 3, 2)[0].tokens == (8, 9, 10)  # found, and …
    assert there.choose(4, CFG, room=60).plain  # … not worth a batch


def coincidental_history() -> HistoryIndex:
    """The last token follows a 2-token context seen three times before, each time continued the same way."""
    h = HistoryIndex()
    h.extend([5, 4, 3, 8, 9, 10, 6, 4, 3, 8, 9, 10, 1, 4, 3, 8, 9, 10, 7, 4, 3])
    return h


def test_a_reply_whose_short_match_drafts_fail_stops_drafting_them_within_a_few_steps_and_tries_again_later():
    def fail_until_plain(auto: AutoPolicy, count_costs: bool) -> tuple[int, StepChoice]:
        failed, choice = 0, auto.choose(h.tokens[-1], CFG, room=60)
        while not choice.plain and failed < 20:
            assert choice.drafts[0].match < SHORT_MATCH and choice.expected_gain > 1.0
            auto.observe(choice, [999], "", 0)  # the model wrote something else: nothing of the draft landed
            failed += 1
            if count_costs:
                auto.observe_cost(choice, 1, MID.cost(1 + sum(len(d.tokens) for d in choice.drafts)))
            choice = auto.choose(h.tokens[-1], CFG, room=60)
        return failed, choice

    h = coincidental_history()
    auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), MID, AcceptanceStats())
    failed, choice = fail_until_plain(auto, count_costs=True)
    assert 1 <= failed <= 3 and choice.plain
    # The statistics alone learn it far more slowly: without the steps' costs, Auto goes on drafting.
    stats_only = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), MID, AcceptanceStats())
    assert fail_until_plain(stats_only, count_costs=False)[0] == 20
    # A copy of earlier text is still drafted at once: a long match is not a coincidence.
    copying = copying_history()
    assert not AutoPolicy(DraftSources(copying, NgramPool(max_len=7)), MID, auto.stats).choose(
        copying.tokens[-1], CFG, room=60).plain
    copy_choice = AutoPolicy(DraftSources(copying, NgramPool(max_len=7)), MID, AcceptanceStats())
    copy_choice.drafted_tokens, copy_choice.drafted_cost = auto.drafted_tokens, auto.drafted_cost
    assert not copy_choice.choose(copying.tokens[-1], CFG, room=60).plain
    # Steps without drafts give the reply's short-match drafts their chance back, where what the reply goes on
    # to write is what they would have drafted.
    offered = auto.sources.matches(h.tokens[-1], 15, 4)[0].tokens
    for _ in range(200):
        auto.observe(choice, [*offered, 999], "", 0)
        auto.observe_cost(choice, 1, 1.0)
        choice = auto.choose(h.tokens[-1], CFG, room=60)
        if not choice.plain:
            break
    assert not choice.plain and 0 < auto.trust < 1


def test_drafts_auto_does_not_verify_are_learned_from_the_tokens_the_reply_then_commits():
    # A short match in an earlier chat starts from a low prior, too low to verify on this curve: the reply's
    # text, not a verification, shows its drafts land, and Auto drafts them; where they would not, it never does.
    def steps_until_drafted(reply_agrees: bool) -> int:
        corpus = CorpusIndex()
        corpus.add([1, 3, 4, 8, 9, 10])
        h = HistoryIndex()
        h.extend([2, 3, 4])
        auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7), corpus=corpus), MID, AcceptanceStats())
        for step in range(1, 40):
            choice = auto.choose(4, CFG, room=60)
            if not choice.plain:
                assert choice.drafts[0].source == DraftSource.CORPUS
                return step
            auto.observe(choice, [8, 9, 10] if reply_agrees else [80, 90, 100], "", 0)
        return 0

    assert 1 < steps_until_drafted(reply_agrees=True) <= 10
    assert steps_until_drafted(reply_agrees=False) == 0


def test_short_match_drafts_that_land_keep_their_full_value_though_one_fails_now_and_then():
    h = coincidental_history()
    auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), MID, AcceptanceStats())
    for step in range(8):
        choice = auto.choose(h.tokens[-1], CFG, room=60)
        assert not choice.plain
        drafted = choice.drafts[0].tokens
        landed = 0 if step == 3 else len(drafted)
        committed = [*drafted[:landed], 999]
        auto.observe(choice, committed, "history", landed)
        auto.observe_cost(choice, len(committed), MID.cost(1 + len(drafted)))
    assert auto.trust == 1.0


def test_acceptance_stats_learn_from_what_landed():
    stats = AcceptanceStats()
    d = Draft((1, 2, 3, 4), "history", 5)
    prior = stats.p(bucket(d))
    for _ in range(20):
        stats.observe(d, 4, 0)  # its first token never lands
    assert stats.p(bucket(d)) < prior / 2
    # untested: still the prior
    assert stats.p(bucket(d, 3)) == pytest.approx(AcceptanceStats().p(bucket(d, 3)), abs=1e-9)


def test_later_tokens_of_a_draft_count_on_a_longer_match():
    stats = AcceptanceStats()
    d = Draft((1, 2, 3, 4, 5, 6), "history", 2)
    assert bucket(d, 0)[1] == 2 and bucket(d, 4)[1] == 6
    ps = [stats.p(bucket(d, k)) for k in range(6)]
    assert ps == sorted(ps) and ps[-1] > ps[0]
    e = [_Estimate(d, stats, False, 1.0).at(L) for L in range(3)]
    assert e == pytest.approx(expected_by_hand(stats, d, False)[:3])
    assert e[0] == 1.0 and e[1] == pytest.approx(1 + ps[0])
    assert e[2] == pytest.approx(1 + ps[0] + ps[0] * ps[1])


def test_auto_stops_a_draft_where_earlier_occurrences_disagree():
    h = copying_history()
    stats = AcceptanceStats()
    auto = AutoPolicy(DraftSources(h, NgramPool(max_len=7)), STEEP, stats)
    d = auto.sources.history.propose(h.tokens[-1], 8, 1)[0]
    split = Draft(d.tokens, d.source, d.match, (AGREE, AGREE, SPLIT, SPLIT, SPLIT, SPLIT, SPLIT, SPLIT))
    agree = Draft(d.tokens, d.source, d.match, (AGREE,) * 8)
    assert _Estimate(split, stats, False, 1.0).at(8) < _Estimate(agree, stats, False, 1.0).at(8)
    assert stats.p(bucket(split, 2)) < 0.7 < stats.p(bucket(agree, 2))
    assert stats.p(bucket(Draft((1,), "history", 12, (ALONE,)))) > 0.85


def test_fixed_policy_shrinks_the_window_to_fit_the_room():
    h = HistoryIndex()
    h.extend([1, 2, 3])
    fixed = FixedPolicy(DraftSources(h, NgramPool(max_len=7)))
    choice = fixed.choose(3, LookaheadConfig(window=8, ngram=4, guesses=0), room=10)
    assert choice.window > 0 and (choice.window - 1) + choice.window * 2 <= 10


# --- a source whose drafts stopped landing for a while, or never land -------------------------------------------

# The measured curve of a 1.2B hybrid model (LFM2's shape, Q4_K_M) on 2 threads: a draft of L tokens pays only
# if each lands with p >= 0.65 or so.
HYBRID = CostCurve(sizes=tuple(range(1, 14)), last_logit=(1, 1.51, 1.94, 2.29, 2.98, 3.01, 3.6, 3.6, 4.12, 4.53,
                                                          4.53, 4.88, 5.2),
                   all_logits=(1, 1.86, 2.19, 2.34, 3.2, 3.27, 3.6, 3.6, 4.12, 4.78, 5.3, 5.53, 5.8),
                   base_ms=22, threads=2)
ONE_DRAFT = LookaheadConfig(window=0, ngram=8, guesses=1, auto=True)


def replay_steps(stats: AcceptanceStats, right: float, n_tokens: int, seed: int = 0) -> list[tuple[int, int]]:
    """Auto stepping through a reply whose only drafts are replayed ones (engine/decoding/replay.py), right at
    ``right`` of its positions: (batch size, tokens committed) per step."""
    from engine.decoding.replay import ReplayDrafts

    prompt, reply = [1, 2, 3], list(range(1000, 1000 + n_tokens + 20))
    history = HistoryIndex()
    history.extend(prompt, "prompt")
    auto = AutoPolicy(DraftSources(history, NgramPool(max_len=7), documents=ReplayDrafts(prompt, reply, right, 10**6,
                                                                                          seed)), HYBRID, stats)
    steps, pos = [], 0
    while pos < n_tokens:
        choice = auto.choose(history.tokens[-1], ONE_DRAFT, room=12)
        drafted = choice.drafts[0].tokens if choice.drafts else ()
        landed = 0
        while landed < len(drafted) and drafted[landed] == reply[pos + landed]:
            landed += 1
        committed = reply[pos : pos + landed + 1]
        auto.observe(choice, committed, "replay" if landed else "", landed)
        auto.observe_cost(choice, len(committed), HYBRID.cost(1 + len(drafted)))
        history.extend(committed, "reply")
        steps.append((1 + len(drafted), len(committed)))
        pos += len(committed)
    return steps


def test_a_source_whose_drafts_failed_a_few_times_in_a_row_is_tried_again_and_pays_once_it_lands():
    stats = AcceptanceStats()
    stuck = replay_steps(stats, right=0.0, n_tokens=50)  # a bad start: every draft wrong
    assert [n for n, _ in stuck[10:]] == [1] * (len(stuck) - 10)  # Auto stopped drafting them
    later = replay_steps(stats, right=0.6, n_tokens=3000, seed=1)  # the same source, now right at 60%
    tail = later[len(later) // 2 :]
    assert sum(t for _, t in tail) / len(tail) > 2.5  # drafting again, several tokens a step
    assert sum(t for _, t in tail) / sum(HYBRID.cost(n) for n, _ in tail) > 1.2


def test_drafts_that_never_land_are_retried_seldom_and_cheaply():
    steps = replay_steps(AcceptanceStats(), right=0.0, n_tokens=3000)
    drafted = [n for n, _ in steps if n > 1]
    assert 0 < len(drafted) < 0.03 * len(steps)
    wasted = sum(HYBRID.cost(n) - 1 for n in drafted)
    assert wasted / len(steps) < 0.02  # under 2% of the time plain decoding takes


def test_acceptance_fades_every_bucket_with_each_observed_draft_over_thousands_of_steps():
    # The statistics fade by shrinking one unit, not bucket by bucket; what they estimate must be what fading
    # every bucket would give, also past the point where the unit is reset.
    import random

    from engine.decoding.acceptance import DECAY, MAX_P, PRIOR_WEIGHT, _prior

    rng = random.Random(3)
    stats = AcceptanceStats()
    tested: dict = {}
    accepted: dict = {}
    drafts = [Draft(tuple(range(n)), source, match, origin="reply")
              for n, source, match in ((3, "history", 2), (8, "history", 9), (2, "pool", 1), (5, "corpus", 3))]
    for step in range(6000):
        d = rng.choice(drafts)
        n_accepted = rng.randint(0, len(d.tokens))
        sure = rng.random() < 0.5
        stats.observe(d, len(d.tokens), n_accepted, fade=True, sure=sure)
        for b in tested:
            tested[b] *= DECAY
            accepted[b] *= DECAY
        for k in range(min(n_accepted + 1, len(d.tokens))):
            b = bucket(d, k, sure)
            tested[b] = tested.get(b, 0.0) + 1.0
            accepted[b] = accepted.get(b, 0.0) + (1.0 if k < n_accepted else 0.0)
        if step % 500 == 499:
            for b in tested:
                want = min((accepted[b] + _prior(b) * PRIOR_WEIGHT) / (tested[b] + PRIOR_WEIGHT), MAX_P)
                assert stats.p(b) == pytest.approx(want, rel=1e-9)
    assert stats.unit > DECAY**6000 * 1e30  # the unit was reset on the way


def test_rows_that_predict_what_a_grammar_gives_are_priced_without_their_logits():
    dear_logits = CostCurve(sizes=(1, 2, 4, 8), last_logit=(1, 1.1, 1.3, 1.7), all_logits=(1, 1.6, 2.8, 5.2),
                            base_ms=10, threads=2)  # a large vocabulary's output matrix on a small model
    given, free = _Prices(dear_logits, given=3), _Prices(dear_logits)
    assert given[1] == free[1] == 1.0
    assert given[3] == pytest.approx(dear_logits.cost(3, 1))  # every row's next token is given
    assert given[6] == pytest.approx(dear_logits.cost(6, 3)) and given[6] < free[6]
    assert free[6] == pytest.approx(dear_logits.cost(6))


def test_a_string_ended_at_once_is_a_weaker_guess_than_one_ended_where_a_copy_reached_a_clause_end():
    # Both drafts close a string and go on with the key a grammar forces; the first guesses the value ends before
    # anything of it was copied, the second after copying two of its tokens from the prompt.
    at_once = Draft((11, 12, 13), DraftSource.TEXT, 2, (ENDS_NOW, FORCED, FORCED))
    after_copy = Draft((1, 2, 11, 12, 13), DraftSource.TEXT, 2, (ALONE, ALONE, ENDING, FORCED, FORCED))
    stats = AcceptanceStats()
    assert stats.p(bucket(at_once, 0)) < stats.p(bucket(after_copy, 2)) / 1.5
    p = stats.p(bucket(at_once, 0))
    assert least_paying_p(STEEP) > p > least_paying_p(FLAT)  # drafted only where rows cost little
