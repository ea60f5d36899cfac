"""engine.tools.dryscreen: draft tokens counted by the penalty DRY would give them, while the ones before were
right."""

from engine.decoding.settings import SamplingConfig
from engine.tools.dryscreen import bucket, replay

DRY = SamplingConfig(dry_multiplier=0.8)


def test_a_reply_that_repeats_itself_counts_its_own_drafts_in_the_rising_penalty_buckets():
    phrase = list(range(10, 22))  # 12 tokens, said twice: the second time, drafts copy the first
    tally: dict = {}
    replay([1, 2, 3], [*phrase, 99, *phrase], lambda t: False, DRY, tally)
    reply_buckets = {edge: counts for (origin, edge), counts in tally.items() if origin == "reply"}
    # the copy's later tokens extend a long repeat: past 4.3 logits, and every one of them landed
    tested, landed = reply_buckets[float("inf")]
    assert tested >= 6 and landed == tested
    assert all(landed <= tested for tested, landed in tally.values())


def test_a_draft_token_after_a_wrong_one_is_not_counted():
    tally: dict = {}
    # the prompt says "5 6 7 8", the reply "5 6 9 9": after "5" the draft "6 7 8" lands its 6 and misses at 7;
    # after "5 6" the draft "7 8" misses at 7. Its 8 is never counted: 3 tested, 1 landed.
    replay([5, 6, 7, 8, 0], [5, 6, 9, 9], lambda t: False, DRY, tally)
    assert tally == {("prompt", 0.0): [3, 1]}


def test_buckets_are_dry_0_8_s_penalties_for_2_to_5_tokens_of_repeat():
    assert [bucket(p) for p in (0.0, 0.8, 1.4, 2.45, 4.2875, 7.5)] == [0.0, 0.8, 1.4, 2.45, 4.3, float("inf")]
