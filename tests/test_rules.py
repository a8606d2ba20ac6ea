"""Each rule a stage's body runs is the function the plain path runs (docs/architecture.md), called
with the window's own sizes on the host and with a stage's padded ones and counts as tensors in its
body; here the two calls are compared directly: the same rows, the same picks, the same path. (The
whole stages against the plain forwards: tests/test_rollout.py, test_chain_draft.py,
test_eagle_tree.py, test_eagle_verify.py.)"""
import random

import pytest
import torch

from mirror_sd import branches, load_pair
from mirror_sd.branches import choose_branches
from mirror_sd.drafting.tree import Tree, tree_mask, walk_tree
from mirror_sd.methods.mirror_rollouts import chain, rollout_layout
from mirror_sd.methods.verify import walk_tree_picks
from mirror_sd.models.channel import Channel
from mirror_sd.models.forwards import stage_cache
from mirror_sd.models.rollout import Rollouts, first_forward
from mirror_sd.models.stages import copy_into
from mirror_sd.tree_rules import ancestors, greedy_path


def random_tree(nodes: int, seed: int, vocab: int = 16) -> Tree:
    """``nodes`` nodes, each parent before its children, siblings with distinct tokens."""
    rng = random.Random(seed)
    tokens, parents = [], []
    for i in range(nodes):
        parent = rng.randrange(-1, i)
        taken = {tokens[c] for c in range(i) if parents[c] == parent}
        tokens.append(rng.choice([t for t in range(vocab) if t not in taken]))
        parents.append(parent)
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    return Tree(tokens, parents, depths, [0.0] * nodes)


def picks_down(tree: Tree, seed: int, vocab: int = 16) -> list[int]:
    """A pick per row [root, nodes]: mostly one of the row's children's tokens, so paths run deep."""
    rng, kids = random.Random(seed), tree.children()
    return [tree.tokens[rng.choice(kids[node])] if node in kids and rng.random() < 0.8 else rng.randrange(vocab)
            for node in range(-1, len(tree.tokens))]


@pytest.mark.parametrize("seed", range(12))
def test_the_tree_mask_is_each_rows_ancestors(seed):
    tree = random_tree(1 + seed, seed)
    expected = torch.zeros(len(tree.tokens) + 1, len(tree.tokens) + 1, dtype=torch.bool)
    for row in range(len(tree.tokens) + 1):
        node = row - 1
        expected[row, 0] = True
        while node >= 0:
            expected[row, node + 1] = True
            node = tree.parents[node]
    assert torch.equal(tree_mask(tree.parents), expected)


@pytest.mark.parametrize("seed", range(16))
def test_the_greedy_walk_is_one_rule_on_the_host_and_in_a_padded_stage(seed):
    """``walk_tree_picks`` (the host's tree verification) and ``greedy_path`` as a tree verification
    stage's body runs it (models/eagle_verify.py: W rows, the padding rows their own parents and not
    real) accept the path a walk down the tree by the picks finds, and give the same next token."""
    tree = random_tree(1 + seed % 12, seed)
    picks = picks_down(tree, seed)
    walked = walk_tree(tree.tokens, tree.children(), lambda node: picks[node + 1], lambda pick: pick)
    assert walk_tree_picks(tree.tokens, tree.parents, picks) == walked
    assert walk_tree_picks(tree.tokens, tree.parents, torch.tensor(picks)) == walked

    W, rows = 16, len(tree.tokens) + 1
    tokens, parents = torch.zeros(W, dtype=torch.long), torch.arange(W)
    tokens[1:rows] = torch.tensor(tree.tokens)
    parents[1:rows] = torch.tensor([p + 1 for p in tree.parents])
    padded = torch.randint(0, 16, (W,), generator=torch.Generator().manual_seed(seed))
    padded[:rows] = torch.tensor(picks)
    accepted, deepest, path = greedy_path(ancestors(parents), tokens, parents, padded, torch.arange(W) < rows)
    A = int(accepted)
    assert ([int(row) - 1 for row in path[1:1 + A]], int(padded[deepest])) == walked and int(path[0]) == 0


def window_channel(T: int, kappa: int, window: list[int], seed: int):
    """A token channel over T rows whose candidates include some of the window's own tokens (acceptances)."""
    g = torch.Generator().manual_seed(seed)
    top_ids = torch.stack([torch.randperm(16, generator=g)[:kappa] for _ in range(T)])
    for r, token in enumerate(window[:T - 1]):
        if r % 2 == 0 and token not in top_ids[r, :-1]:
            top_ids[r, -1] = token
    top_logp = torch.randn(T, kappa, generator=g).sort(dim=-1, descending=True).values
    return top_ids, top_logp, torch.randn(T - 1, generator=g)


@pytest.mark.parametrize("seed", range(8))
def test_tree_branch_scores_sum_the_path_and_skip_the_rows_children(seed):
    """A tree window's branches: each scored by its path's log-probs plus its own, root to leaf; a
    candidate that is a child of its row is an acceptance, never a branch."""
    tree = random_tree(2 + seed, seed)
    T, kappa = len(tree.tokens) + 1, 3
    top_ids, top_logp, window_logp = window_channel(T, kappa, [], seed)
    kids = tree.children()
    for row in range(T):
        child = tree.tokens[kids[row - 1][0]] if row - 1 in kids else None
        if child is not None and seed % 2 and child not in top_ids[row]:
            top_ids[row, 0] = child  # a child's token among the candidates: an acceptance
    r, roots, scores, valid = choose_branches(tree.tokens, top_ids, top_logp, window_logp, T * kappa, tree.parents)
    for row, root, score, ok in zip(r.tolist(), roots.tolist(), scores.tolist(), valid.tolist()):
        path, node = 0.0, row - 1
        while node >= 0:
            path, node = path + float(window_logp[node]), tree.parents[node]
        rank = top_ids[row].tolist().index(root)
        assert score == pytest.approx(path + float(top_logp[row, rank]), abs=1e-9)
        assert ok == (root not in [tree.tokens[c] for c in kids.get(row - 1, [])])
    assert sorted(zip(r.tolist(), roots.tolist())) == sorted((a, int(v)) for a in range(T) for v in top_ids[a])


@pytest.fixture(scope="module")
def draft(tiny_dirs):
    return load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), target_device="cpu",
                     draft_device="cpu").draft


def rollout_stage(draft, spec: Rollouts, chain_ids: list[int], channel: Channel, width: int = 32):
    """The rollout stage ``spec`` names, its chain and channel loaded as its ``run`` loads them."""
    stage = stage_cache({}, draft, 200, [spec]).stages.stage(spec.name, width)
    with torch.inference_mode():
        copy_into(stage.x[0, :len(chain_ids)], torch.tensor(chain_ids))
        copy_into(stage.channel[:channel.packed.shape[0]], channel.packed)
    return stage


@pytest.mark.parametrize("T,kappa,budget,unseen", [(3, 4, 16, 1), (5, 2, 6, 2), (1, 3, 3, 1), (6, 4, 9, 3)])
def test_the_branch_choice_is_one_rule_on_the_host_and_on_the_rollout_stage(draft, T, kappa, budget, unseen):
    """The rollout stage's branch choice over its padded channel (counts as tensors) and the host's
    over the window's own rows: the same branches, roots, scores and validity, row for row."""
    rows = T + 2  # the stage's channel: two rows of padding
    spec = Rollouts(min(budget, T * kappa), 2, kappa, rows, 16)
    window = [6, 11, 2, 8, 12, 1, 3, 9][:T - 1]
    top_ids, top_logp, window_logp = window_channel(T, kappa, window, seed=T + kappa)
    chain_ids = [4, 7, 3][:unseen] + window
    stage = rollout_stage(draft, spec, chain_ids, Channel.of(top_ids, top_logp, window_logp))
    with torch.inference_mode():
        staged = stage.choose(torch.tensor([T]), torch.tensor([len(chain_ids)]))
    plain = choose_branches(window, top_ids, top_logp, window_logp, spec.budget)
    for got, expected in zip(staged, plain):
        assert torch.equal(got, expected)


@pytest.mark.parametrize("T,B,unseen,base", [(3, 4, 1, 4), (5, 6, 2, 7), (1, 2, 1, 3), (4, 5, 3, 0)])
def test_the_rollouts_first_forward_is_one_layout_on_the_host_and_on_the_stage(draft, T, B, unseen, base):
    """``rollout_layout`` (the host's first rollout forward: the window's rows alone) and
    ``first_forward`` as the rollout stage's body calls it (W rows with padding between the chain
    and the roots, counts as tensors, every slot of its cache): the same ids, positions, slots and
    views for the chain's rows and the roots' rows, and the stage's rows see nothing past them."""
    window = [6, 11, 2, 8, 12][:T - 1]
    pending = [4, 7, 3][:unseen]
    C, W, R = unseen + len(window), 16, T + 2
    g = torch.Generator().manual_seed(T + B)
    r, roots = torch.randint(0, T, (B,), generator=g), torch.randint(0, 16, (B,), generator=g)
    cache = draft.new_cache(100)
    cache.length = base
    run = type("Run", (), {"sequence": list(range(base)) + pending})()
    ids, positions, mask = rollout_layout(run, cache, chain(window), r, roots)

    s, rows = torch.arange(100), torch.arange(W)
    chain_ids = torch.zeros(W, dtype=torch.long)
    chain_ids[:C] = torch.tensor(pending + window)
    parents = (torch.arange(R) - 1).clamp(min=0)
    got = first_forward(s, rows, torch.tensor([base]), torch.tensor([unseen]), torch.tensor([C]), r, roots,
                        chain_ids, ancestors(parents), torch.arange(R))
    ids_s, positions_s, slots_s, sees_s, used = got
    kept = torch.cat([rows[:C], rows[W - B:]])  # the chain's rows, then the roots'
    S = base + C + B
    assert torch.equal(used, (rows < C) | (rows >= W - B))
    assert torch.equal(ids_s[kept], ids) and torch.equal(positions_s[kept], positions)
    assert torch.equal(slots_s[kept], base + torch.arange(C + B))
    assert torch.equal(sees_s[kept][:, :S], mask) and not sees_s[kept][:, S:].any()


def test_a_tree_windows_roots_see_the_path_to_their_row(draft):
    """On a tree window a branch's root sees the committed tokens, the path to its row (tree_mask)
    and itself, at the position after that row."""
    tree = random_tree(6, seed=3)
    cache = draft.new_cache(100)
    cache.length = 5
    run = type("Run", (), {"sequence": list(range(6))})()
    r, roots = torch.tensor([0, 3, 6, 2]), torch.tensor([1, 2, 3, 4])
    _, positions, mask = rollout_layout(run, cache, tree, r, roots)
    N, B = len(tree.tokens), len(r)
    seen = tree_mask(tree.parents)
    for b, row in enumerate(r.tolist()):
        view = mask[-B + b]
        assert view[:6].all() and torch.equal(view[6:6 + N], seen[row, 1:])
        assert view[6 + N:].tolist() == [i == b for i in range(B)]
        assert int(positions[-B + b]) == 6 + ([0] + tree.depths)[row]


def test_the_branch_scoring_is_a_setting_both_paths_read(draft, monkeypatch):
    """research swaps the branch rule through ``branches.use_scoring``: the host's choice reads it,
    and so does the rollout stage's spec made after it (its stages named apart), giving the same
    branches as each other and other ones than the shipped scoring."""
    T, kappa, window = 4, 3, [6, 11, 2]
    top_ids, top_logp, window_logp = window_channel(T, kappa, window, seed=5)
    shipped = choose_branches(window, top_ids, top_logp, window_logp, 5)
    monkeypatch.setitem(branches.SCORINGS, "worst-first", lambda prefix, top_logp: -(prefix[:, None] + top_logp))
    branches.use_scoring("worst-first")
    try:
        spec = Rollouts(5, 2, kappa, T, 16)
        plain = choose_branches(window, top_ids, top_logp, window_logp, 5)
    finally:
        branches.use_scoring("step-end")
    assert spec.scoring == "worst-first" and spec.name != Rollouts(5, 2, kappa, T, 16).name
    stage = rollout_stage(draft, spec, [4] + window, Channel.of(top_ids, top_logp, window_logp))
    with torch.inference_mode():
        staged = stage.choose(torch.tensor([T]), torch.tensor([T]))
    assert all(torch.equal(a, b) for a, b in zip(staged, plain))
    assert not torch.equal(plain[1], shipped[1])
    with pytest.raises(KeyError, match="no branch scoring"):
        branches.use_scoring("nonesuch")
