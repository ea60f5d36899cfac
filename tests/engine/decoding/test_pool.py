from engine.decoding.pool import NgramPool


def test_candidates_are_ranked_by_hits_then_recency():
    pool = NgramPool(max_len=3)
    pool.add(1, [2, 3, 4])
    pool.add(1, [5, 6, 7])
    assert pool.candidates(1, 2, 3) == [(5, 6, 7), (2, 3, 4)]  # most recent first
    pool.observe_accepted(1, [2, 3])
    assert pool.candidates(1, 2, 3) == [(2, 3, 4), (5, 6, 7)]  # verified beats recent


def test_candidates_are_cut_to_length_and_deduplicated():
    pool = NgramPool(max_len=4)
    pool.add(9, [1, 2, 3, 4])
    pool.add(9, [1, 2, 7, 8])
    pool.add(9, [1, 2])
    # Cut to 2 tokens all three are (1, 2): one candidate.
    assert pool.candidates(9, 5, 2) == [(1, 2)]
    assert len(pool.candidates(9, 5, 4)) == 2


def test_unknown_key_has_no_candidates():
    pool = NgramPool(max_len=3)
    pool.add(1, [2])
    assert pool.candidates(42, 3, 3) == []


def test_a_full_key_evicts_its_least_useful_entry():
    pool = NgramPool(max_len=2, capacity=2)
    pool.add(1, [10])
    pool.add(1, [11])
    pool.observe_accepted(1, [10])
    pool.add(1, [12])  # evicts (11,): fewer hits than (10,), older than (12,)
    got = set(pool.candidates(1, 5, 2))
    assert got == {(10,), (12,)}


def test_add_tokens_indexes_every_position_of_a_prompt():
    pool = NgramPool(max_len=2)
    pool.add_tokens([5, 6, 7, 5, 6, 8])
    assert (6, 8) in pool.candidates(5, 5, 2)
    assert (6, 7) in pool.candidates(5, 5, 2)
    assert pool.candidates(8, 5, 2) == []  # last token: nothing follows it


def test_a_pool_written_and_read_back_keeps_its_entries_hits_and_order():
    pool = NgramPool(max_len=3)
    pool.add(1, [2, 3], "window")
    pool.add(1, [4], "reply")
    pool.observe_accepted(1, [2])
    back = NgramPool.from_json(pool.to_json(), max_len=3, capacity=8, origin="kept")
    assert back.to_json() == pool.to_json()
    assert back.ranked(1, 2, 3) == [((2, 3), "kept"), ((4,), "kept")]  # verified first, then recent
    kept = NgramPool(max_len=3)
    kept.merge(pool, frozenset({"reply"}), "kept")
    assert kept.to_json() == pool.to_json()  # the window's entry comes along: it was verified
