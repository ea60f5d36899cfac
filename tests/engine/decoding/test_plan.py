import numpy as np
import pytest

from engine.decoding.plan import ALL_SEQS, build_step, build_tree, candidate_seq, window_seq


def test_tree_shares_common_prefixes_and_lists_best_path_first():
    nodes, root = build_tree([(1, 2, 3), (1, 2, 4), (5, 6, 7)])
    assert [n.token for n in nodes] == [1, 2, 3, 4, 5, 6, 7]
    assert [n.depth for n in nodes] == [1, 2, 3, 3, 1, 2, 3]
    assert nodes[0].seqs == [candidate_seq(0), candidate_seq(1)]  # before build_step adds idle ones
    assert nodes[3].seqs == [candidate_seq(1)]
    assert nodes[3].parent == 1
    assert set(root) == {1, 5}


def test_plain_step_is_the_pending_tokens_only():
    plan = build_step([7], n_kv=10, candidates=[], window_levels=None)
    assert plan.tokens.tolist() == [7]
    assert plan.positions.tolist() == [10]
    assert plan.seq_ids == [ALL_SEQS]
    assert plan.logits.tolist() == [True]


def test_step_layout_for_w3_n3_g2():
    levels = np.array([[0, 11, 12], [20, 21, 22]], dtype=np.int32)  # N-1 = 2 levels, W = 3
    plan = build_step([100, 101], n_kv=50, candidates=[(1, 2), (1, 3)], window_levels=levels)
    P = 51  # input token position
    assert plan.input_index == 1 and plan.input_pos == P
    used = {candidate_seq(0), candidate_seq(1), window_seq(0), window_seq(1), window_seq(2)}
    idle = tuple(s for s in ALL_SEQS if s not in used)
    expected = [
        # token, pos, seqs, logits
        (100, 50, ALL_SEQS, False),  # re-evaluated accepted draft
        (101, 51, ALL_SEQS, True),  # input token
        # best path: its candidates plus seq 0 and every idle sequence
        (1, 52, tuple(sorted(idle + (candidate_seq(0), candidate_seq(1)))), True),
        (2, 53, tuple(sorted(idle + (candidate_seq(0),))), True),
        (3, 53, (candidate_seq(1),), True),
        (11, 52, (window_seq(1), window_seq(2)), False),  # level 0, columns 1..2
        (12, 53, (window_seq(2),), False),
        (20, 52, (window_seq(0),), True),  # level 1 = last level: logits
        (21, 53, (window_seq(1),), True),
        (22, 54, (window_seq(2),), True),
    ]
    got = list(zip(plan.tokens.tolist(), plan.positions.tolist(), plan.seq_ids, plan.logits.tolist(), strict=True))
    assert got == expected
    assert plan.window_pred_index.tolist() == [7, 8, 9]
    # The best candidate's path sits right after the input token; the other branch does not.
    assert plan.in_place_prefix([0, 1]) == 2
    assert plan.in_place_prefix([0, 2]) == 1
    # Keeping the best path's first node: the used sequences not passing through it need a copy.
    assert plan.missing_seqs(0) == sorted(used - {candidate_seq(0), candidate_seq(1)})
    assert plan.rows[1] == 0 and plan.rows[7] == 4 and plan.rows[0] == -1
    assert plan.n_logits == plan.logits.sum() == max(plan.rows) + 1


def test_window_with_n2_predicts_from_level_zero_and_the_input_token():
    levels = np.array([[0, 11, 12]], dtype=np.int32)
    plan = build_step([5], n_kv=0, candidates=[], window_levels=levels)
    assert plan.window_pred_index.tolist() == [0, 1, 2]
    assert plan.logits.tolist() == [True, True, True]


def test_too_many_candidates_is_refused():
    with pytest.raises(ValueError):
        build_step([1], 0, candidates=[(1,)] * 17, window_levels=None)


def test_rows_that_predict_what_a_grammar_gives_get_no_logits():
    # the grammar gives 1, 2 and 3 next: the input token's row and the nodes 1 and 2 predict them
    plan = build_step([9], n_kv=0, candidates=[(1, 2, 3, 4), (1, 5)], window_levels=None, given=(1, 2, 3))
    assert plan.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert plan.logits.tolist() == [False, False, False, True, True, True]
    assert plan.rows == [-1, -1, -1, 0, 1, 2] and plan.n_logits == 3
    # a window of N = 2 reads the input token's row: it keeps its logits
    levels = np.array([[0, 11]], dtype=np.int32)
    plan = build_step([9], n_kv=0, candidates=[(1, 2)], window_levels=levels, given=(1, 2))
    assert plan.logits.tolist() == [True, False, True, True]
    # a draft that leaves the given tokens keeps its logits from there on
    plan = build_step([9], n_kv=0, candidates=[(7, 8)], window_levels=None, given=(1, 2))
    assert plan.logits.tolist() == [False, True, True]
