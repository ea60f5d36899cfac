"""Layout of one lookahead step: which token goes where in the batch.

Sequence-id plan (fixed, whatever W and G are this step):

    seq 0                        committed tokens
    seq 1 .. MAX_GUESSES         verification candidates (candidate g -> 1 + g)
    seq 1 + MAX_GUESSES + i      lookahead column i

Every committed token carries all of these ids, so each speculative sequence
sees the whole committed prefix. One step's batch, in order:

    1. pending tokens: committed but not yet in the KV cache (normally just the
       last committed token; more when accepted drafts had to be re-evaluated).
       Logits on the last one, the "input" token at position P (unless a
       grammar gives the next token).
    2. the candidate tree, depth first, best candidate's path first: one batch
       token per tree node at position P + depth, its sequence ids the
       candidates passing through it, logits on every node but those whose
       next token a grammar allows alone (``given``). The best path's
       nodes also carry seq 0 and every sequence not used this step: no token
       of this batch that could see them does, and if they are accepted they
       are already tagged as committed tokens must be.
    3. the Jacobi window: level 0 columns 1..W-1 at P + i (column 0 of level 0
       is the input token), seen by the columns at and after them; levels
       1..N-2 of column i at P + j + i in column i's sequence only. Logits on
       the last level.

The KV cache places a batch in consecutive free cells after the committed ones,
so the best candidate's path lands exactly where plain decoding would have put
those tokens: accepting along it keeps the cache in position order. Accepted
tokens from any other branch are dropped from the cache after the step and
re-evaluated at the front of the next batch.

What a step holds is decided elsewhere (fixed settings or Auto, in auto.py) and
handed over as a ``StepChoice``; ``build_step`` lays it out.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engine.decoding.drafts import Draft
from engine.decoding.settings import MAX_GUESSES, MAX_WINDOW

N_SEQ = 1 + MAX_GUESSES + MAX_WINDOW
ALL_SEQS = tuple(range(N_SEQ))


def candidate_seq(g: int) -> int:
    return 1 + g


def window_seq(i: int) -> int:
    return 1 + MAX_GUESSES + i


@dataclass(frozen=True)
class StepChoice:
    """What one step holds. No drafts and no window = a plain step."""

    drafts: tuple[Draft, ...] = ()
    window: int = 0
    ngram: int = 0
    reason: str = ""
    expected_gain: float = 1.0  # expected tokens per unit cost, relative to a plain step

    @property
    def plain(self) -> bool:
        return not self.drafts and self.window == 0


@dataclass
class TreeNode:
    token: int
    depth: int  # 1 = drafts position P + 1
    parent: int  # node index, -1 for the input token
    batch_index: int
    seqs: list[int] = field(default_factory=list)
    children: dict[int, int] = field(default_factory=dict)  # token -> node index


@dataclass
class StepPlan:
    """A step's batch in arrays plus what is needed to read its results."""

    tokens: np.ndarray  # int32 [n]
    positions: np.ndarray  # int32 [n]
    seq_ids: list[tuple[int, ...]]  # per batch token
    logits: np.ndarray  # bool [n]
    input_index: int  # batch index of the last pending token
    input_pos: int  # its position P
    n_pending: int
    nodes: list[TreeNode]
    root_children: dict[int, int]  # token -> node index (depth 1)
    window_pred_index: np.ndarray  # int [W]: batch index whose logits predict column i's next level
    window: int
    ngram: int
    # Row of the logits matrix for each batch index (-1 where none). Plain lists: a step reads a few of them,
    # right after a decode that left the CPU's caches cold, where every numpy call costs tens of microseconds.
    rows: list[int]
    n_logits: int

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    def missing_seqs(self, node_index: int) -> list[int]:
        """Sequences a kept best-path node lacks, which committed tokens must carry."""
        have = set(self.nodes[node_index].seqs)
        return [s for s in ALL_SEQS if s not in have]

    def in_place_prefix(self, path: Sequence[int]) -> int:
        """How many nodes of an accepted ``path`` sit right after the input token."""
        n = 0
        for k, node_idx in enumerate(path):
            if self.nodes[node_idx].batch_index != self.input_index + k + 1:
                break
            n += 1
        return n


def build_tree(candidates: Sequence[Sequence[int]]) -> tuple[list[TreeNode], dict[int, int]]:
    """Merge candidates into a prefix tree; nodes are listed depth first, first candidate first."""
    nodes: list[TreeNode] = []
    root: dict[int, int] = {}
    for g, cand in enumerate(candidates):
        children = root
        parent = -1
        for depth, tok in enumerate(cand, start=1):
            tok = int(tok)
            idx = children.get(tok)
            if idx is None:
                idx = len(nodes)
                nodes.append(TreeNode(token=tok, depth=depth, parent=parent, batch_index=-1))
                children[tok] = idx
            nodes[idx].seqs.append(candidate_seq(g))
            parent = idx
            children = nodes[idx].children
    # Depth-first order from the first candidate: its path is contiguous.
    order: list[int] = []

    def visit(children: dict[int, int]) -> None:
        for idx in children.values():  # dicts keep insertion order = candidate rank
            order.append(idx)
            visit(nodes[idx].children)

    visit(root)
    remap = {old: new for new, old in enumerate(order)}
    ordered = [nodes[old] for old in order]
    for node in ordered:
        node.parent = remap[node.parent] if node.parent >= 0 else -1
        node.children = {t: remap[i] for t, i in node.children.items()}
    root = {t: remap[i] for t, i in root.items()}
    return ordered, root


def build_step(
    pending: Sequence[int],
    n_kv: int,
    candidates: Sequence[Sequence[int]],
    window_levels: np.ndarray | None,
    given: Sequence[int] = (),
) -> StepPlan:
    """Lay out one step, in the order of the module's docstring: pending tokens, candidate tree, Jacobi window.

    pending:       committed tokens not yet in the cache (at least one).
    n_kv:          number of tokens already in the cache (position of pending[0]).
    candidates:    draft continuations of pending[-1], best first (at most MAX_GUESSES).
    window_levels: int array [N-1, W] of Jacobi guesses (level 0 column 0 is
                   ignored: the input token stands there), or None / W=0.
    given:         the tokens a grammar allows alone from position P + 1 on: the rows that predict them (the
                   input token and the tree's nodes along them) get no logits unless the window reads them.
    """
    if window_levels is not None and window_levels.size == 0:
        window_levels = None
    _check_step(pending, candidates, window_levels)
    tokens: list[int] = []
    positions: list[int] = []
    seq_ids: list[tuple[int, ...]] = []
    logits: list[bool] = []

    r = len(pending)
    for k, tok in enumerate(pending):
        tokens.append(int(tok))
        positions.append(n_kv + k)
        seq_ids.append(ALL_SEQS)
        logits.append(k == r - 1)
    input_index = r - 1
    P = n_kv + r - 1

    W = 0 if window_levels is None else int(window_levels.shape[1])
    nodes, root_children = build_tree(candidates)
    _place_tree(nodes, len(candidates), W, P, tokens, positions, seq_ids, logits)
    if window_levels is None:
        levels, pred_index = 0, np.zeros(0, dtype=np.int64)
    else:
        levels = int(window_levels.shape[0])
        pred_index = _place_window(window_levels, input_index, P, tokens, positions, seq_ids, logits)
    if given:
        read = set(pred_index.tolist())
        for index in _given_rows(nodes, root_children, input_index, given):
            logits[index] = index in read

    rows, n_logits = _logit_rows(logits)
    return StepPlan(
        tokens=np.asarray(tokens, dtype=np.int32),
        positions=np.asarray(positions, dtype=np.int32),
        seq_ids=seq_ids,
        logits=np.asarray(logits, dtype=bool),
        input_index=input_index,
        input_pos=P,
        n_pending=r,
        nodes=nodes,
        root_children=root_children,
        window_pred_index=pred_index,
        window=W,
        ngram=levels + 1 if W else 0,
        rows=rows,
        n_logits=n_logits,
    )


def _check_step(
    pending: Sequence[int], candidates: Sequence[Sequence[int]], window_levels: np.ndarray | None
) -> None:
    if not pending:
        raise ValueError("a step needs at least one pending token")
    if len(candidates) > MAX_GUESSES:
        raise ValueError(f"at most {MAX_GUESSES} candidates")
    if window_levels is not None and window_levels.shape[1] > MAX_WINDOW:
        raise ValueError(f"at most {MAX_WINDOW} window columns")


def _given_rows(nodes: list[TreeNode], root_children: dict[int, int], input_index: int,
                given: Sequence[int]) -> list[int]:
    """The batch indices whose next token is one of ``given``: the input token's, then each node's along them."""
    out: list[int] = []
    index, children = input_index, root_children
    for tok in given:
        out.append(index)
        child = children.get(int(tok))
        if child is None:
            break
        index, children = nodes[child].batch_index, nodes[child].children
    return out


def _logit_rows(logits: list[bool]) -> tuple[list[int], int]:
    """Each batch index's row of the logits matrix (-1 where none), and how many rows there are."""
    rows, n_logits = [], 0
    for wanted in logits:
        rows.append(n_logits if wanted else -1)
        n_logits += wanted
    return rows, n_logits


def _place_tree(
    nodes: list[TreeNode],
    n_candidates: int,
    W: int,
    P: int,
    tokens: list[int],
    positions: list[int],
    seq_ids: list[tuple[int, ...]],
    logits: list[bool],
) -> None:
    """Append the candidate tree's nodes to the batch (logits on every one); the best path also carries seq 0
    and every sequence not used this step."""
    used = {candidate_seq(g) for g in range(n_candidates)} | {window_seq(i) for i in range(W)}
    idle = tuple(s for s in ALL_SEQS if s not in used)  # includes seq 0
    at = 0 if nodes else -1
    while at >= 0:  # the best path: depth-first order puts it first
        nodes[at].seqs = sorted(set(nodes[at].seqs) | set(idle))
        at = next(iter(nodes[at].children.values()), -1)
    for node in nodes:
        node.batch_index = len(tokens)
        tokens.append(node.token)
        positions.append(P + node.depth)
        seq_ids.append(tuple(node.seqs))
        logits.append(True)


def _place_window(
    window_levels: np.ndarray,
    input_index: int,
    P: int,
    tokens: list[int],
    positions: list[int],
    seq_ids: list[tuple[int, ...]],
    logits: list[bool],
) -> np.ndarray:
    """Append the Jacobi window to the batch, logits on its last level; returns, per column, the batch index whose
    logits predict the column's next level."""
    levels, W = window_levels.shape
    pred_index = np.full(W, -1, dtype=np.int64)
    last = levels - 1
    if last == 0:
        pred_index[0] = input_index
    for i in range(1, W):
        if last == 0:
            pred_index[i] = len(tokens)
        tokens.append(int(window_levels[0, i]))
        positions.append(P + i)
        seq_ids.append(tuple(window_seq(c) for c in range(i, W)))
        logits.append(last == 0)
    for j in range(1, levels):
        for i in range(W):
            if j == last:
                pred_index[i] = len(tokens)
            tokens.append(int(window_levels[j, i]))
            positions.append(P + j + i)
            seq_ids.append((window_seq(i),))
            logits.append(j == last)
    return pred_index
