"""Mirror-SD's tree windows (option ``tree`` > 0; methods/mirror_rollouts.py): the window is a tree, every
branch's rollout grows one (drafting/tree.py: grow_trees), and at temperature 0 it commits vanilla's
tokens."""
import pytest
import torch

from conftest import EQUALITY_TOKENS
from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.drafting.tree import grow_tree, grow_trees
from mirror_sd.branches import choose_branches
from conftest import valid_branches


def reference_trees(first, expand, depth, top_k, total, sees):
    """EAGLE-2's dynamic trees grown one by one on the host, node by node in Python lists (what
    grow_trees computes on the device): the trees as (tokens, parents, depths, scores), and each
    level's (rows' trees, tokens, depth, mask)."""
    B, slots = len(first), sees.shape[1]
    grown = [([], [], [], []) for _ in range(B)]
    slot_of = [{} for _ in range(B)]

    def add(rows, logp, d):
        new = [[] for _ in range(B)]
        top = logp.double().topk(top_k, dim=-1)
        for (b, parent), ids, lps in zip(rows, top.indices.tolist(), top.values.tolist()):
            tokens, parents, depths, scores = grown[b]
            for token, lp in zip(ids, lps):
                tokens.append(token), parents.append(parent), depths.append(d)
                scores.append((scores[parent] if parent >= 0 else 0.0) + lp)
                new[b].append(len(tokens) - 1)
        return new

    fed, level = [], add([(b, -1) for b in range(B)], first, 1)
    for d in range(2, depth + 1):
        rows = [(b, i) for b in range(B) for i in sorted(level[b], key=lambda i: (-grown[b][3][i], i))[:top_k]]
        mask = torch.zeros(len(rows), slots + len(rows), dtype=torch.bool)
        mask[:, :sees.shape[1]] = sees[[b for b, _ in rows]]
        for row, (b, node) in enumerate(rows):
            slot_of[b][node] = slots + row
            a = node
            while a >= 0:
                mask[row, slot_of[b][a]] = True
                a = grown[b][1][a]
        tokens = torch.tensor([grown[b][0][i] for b, i in rows])
        fed.append(([b for b, _ in rows], tokens.tolist(), d - 1, mask))
        level = add(rows, expand(torch.tensor([b for b, _ in rows]), None, None, tokens, d - 1, mask), d)
        slots += len(rows)
    trees = []
    for tokens, parents, depths, scores in grown:
        keep = sorted(sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:total])
        index = {old: new for new, old in enumerate(keep)}
        trees.append(([tokens[i] for i in keep], [index[parents[i]] if parents[i] >= 0 else -1 for i in keep],
                      [depths[i] for i in keep], [round(scores[i], 4) for i in keep]))
    return trees, fed


@pytest.mark.parametrize("B,depth,top_k,total", [(1, 3, 2, 5), (2, 3, 2, 5), (3, 4, 3, 10), (4, 2, 4, 16),
                                                 (2, 1, 3, 2), (5, 5, 2, 64)])
def test_grow_trees_grows_on_the_device_what_the_host_grows_node_by_node(B, depth, top_k, total):
    V = 7
    table = torch.randn(B, depth + 1, V, V, generator=torch.Generator().manual_seed(B * 100 + depth))

    def expand(trees, nodes, parents, tokens, depth, mask):  # children's log-probs: by tree, depth and token
        return torch.log_softmax(table[trees, depth, tokens], dim=-1)

    first = torch.log_softmax(torch.randn(B, V, generator=torch.Generator().manual_seed(7)), dim=-1)
    sees = torch.rand(B, 5, generator=torch.Generator().manual_seed(8)) < 0.5
    fed = []

    def recorded(trees, nodes, parents, tokens, depth, mask):
        fed.append((trees.tolist(), tokens.tolist(), depth, mask))
        return expand(trees, nodes, parents, tokens, depth, mask)

    grown = grow_trees(first, recorded, lambda rows: rows, depth, top_k, total, sees)
    expected, expected_fed = reference_trees(first, expand, depth, top_k, total, sees)
    assert [(t.tokens, t.parents, t.depths, t.scores) for t in grown] == expected
    assert len(fed) == len(expected_fed) == depth - 1  # one call per level, every tree in it
    for (trees, tokens, d, mask), (trees_, tokens_, d_, mask_) in zip(fed, expected_fed):
        assert (trees, tokens, d) == (trees_, tokens_, d_) and torch.equal(mask, mask_)
    one = grow_tree(first[0], recorded, lambda rows: rows, depth, top_k, total, base=5)
    assert (one.tokens, one.parents, one.depths, one.scores) == \
        reference_trees(first[:1], expand, depth, top_k, total, torch.ones(1, 5, dtype=torch.bool))[0][0]


def test_tree_branches_skip_every_child_and_score_the_path():
    # window: root -> a(5) -> b(6); root -> c(7). Rows: 0 root, 1 a, 2 b, 3 c.
    tokens, parents = [5, 6, 7], [-1, 0, -1]
    top_ids = torch.tensor([[5, 7, 8], [6, 9, 1], [2, 3, 4], [0, 1, 6]])  # [rows, kappa]
    top_logp = torch.tensor([[-0.5, -1.0, -2.0], [-0.2, -1.5, -3.0], [-0.1, -0.3, -4.0], [-0.4, -2.0, -5.0]])
    window_logp = torch.tensor([-0.5, -0.2, -1.0])  # each node at its parent's row
    branches = valid_branches(tokens, top_ids, top_logp, window_logp, budget=20, parents=parents)
    assert len(choose_branches(tokens, top_ids, top_logp, window_logp, budget=20, parents=parents)[0]) == 12  # all
    got = {(b.accepted, b.root): round(b.score, 4) for b in branches}
    assert (0, 5) not in got and (0, 7) not in got and (1, 6) not in got  # children: acceptances, not branches
    assert got[(0, 8)] == -2.0 and got[(1, 9)] == -2.0 and got[(2, 2)] == -0.8 and got[(3, 0)] == -1.4
    assert [round(b.score, 4) for b in branches] == sorted(got.values(), reverse=True)
    chain = valid_branches([5, 6], top_ids[:3], top_logp[:3], window_logp[:2], budget=20)
    as_tree = valid_branches([5, 6], top_ids[:3], top_logp[:3], window_logp[:2], budget=20, parents=[-1, 0])
    assert [(b.accepted, b.root, b.score) for b in chain] == [(b.accepted, b.root, b.score) for b in as_tree]


def test_mirror_with_trees_commits_vanillas_tokens(tiny_dirs):
    prompts = ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7"]
    variants = [dict(gamma=3, tree=6), dict(gamma=2, tree=3, branch_budget=3), dict(gamma=4, tree=12, kappa=3, lookup=0),
                dict(gamma=1, tree=4)]
    for draft in ("draft", "reduced_draft"):  # a draft with the target's head, and one over 8 of its 16 tokens
        pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]))
        expected = [generate(pair, p, method="vanilla", max_new_tokens=24, raw=True).token_ids for p in prompts]
        hits, tree_hits = 0, 0
        for options in variants:
            for prompt, tokens in zip(prompts, expected):
                out = generate(pair, prompt, method="mirror", max_new_tokens=24, raw=True, exit_layer=1, **options)
                assert out.error is None and out.token_ids == tokens, f"mirror {options} with {draft} on {prompt!r}"
                steps = out.trace.steps[1:]
                assert all(s.tree is not None and len(s.proposed) <= max(options["tree"], 8) for s in steps)
                for before, after in zip(steps, steps[1:]):
                    if before.rendezvous.hit:  # the hit branch's rolled-out tree is the next window
                        r, root, rolled = before.rendezvous.branches[before.rendezvous.branch_used]
                        assert before.committed[-1] == root and after.proposed == rolled
                        assert after.tree.parents == before.rendezvous.branch_parents[before.rendezvous.branch_used]
                        hits += 1
                        tree_hits += len(set(after.tree.depths)) < len(after.tree.depths)  # not a chain
        assert hits > 0 and tree_hits > 0


def test_mirror_trees_are_refused_at_temperature_above_zero(tiny_pair):
    with pytest.raises(MirrorSDError, match="tree works at temperature 0 only"):
        generate(tiny_pair, "t1 t2 t3", method="mirror", max_new_tokens=16, raw=True, temperature=1.0, gamma=3,
                 tree=8, exit_layer=1)


def test_mirror_trees_are_refused_with_the_draft_s_streams(tiny_pair):
    with pytest.raises(MirrorSDError, match="tree applies with streams=0 only"):
        generate(tiny_pair, "t1", method="mirror", max_new_tokens=4, raw=True, streams=1, tree=8)


def test_the_app_draws_a_tree_window_and_its_rolled_out_trees(tiny_pair):
    from app.trees import ACCEPTED, ROLLED, USED, step_tree, verdict_row

    out = generate(tiny_pair, "t4 t4 t4 t4", method="mirror", max_new_tokens=24, raw=True, gamma=3, tree=6, exit_layer=1)
    step = next(s for s in out.trace.steps[1:] if s.rendezvous.hit and s.tree.path)
    nodes = step_tree(step)
    window = nodes[1:1 + len(step.proposed)]
    assert [n.token for n in window] == step.proposed
    assert [n.parent for n in window] == [0 if p < 0 else p + 1 for p in step.tree.parents]  # as drawn: row = node
    assert sum(n.kind == ACCEPTED for n in window) == len(step.tree.path)
    r, root, rolled = step.rendezvous.branches[step.rendezvous.branch_used]
    assert r == verdict_row(step) == step.tree.path[-1] + 1
    used = [i for i, n in enumerate(nodes) if n.kind == USED]
    assert nodes[used[0]].token == root and [nodes[i].token for i in used[1:]] == rolled
    shape = step.rendezvous.branch_parents[step.rendezvous.branch_used]
    assert [nodes[i].parent for i in used[1:]] == [used[0] if p < 0 else used[p + 1] for p in shape]
    assert any(n.kind == ROLLED for n in nodes)


def test_the_shipped_pair_s_tree_windows_commit_vanillas_tokens(embedded_pair, equality_prompts, vanilla_reference):
    copied = 0
    for prompt, expected in list(zip(equality_prompts, vanilla_reference))[:2]:
        out = generate(embedded_pair, prompt, method="mirror", max_new_tokens=EQUALITY_TOKENS, gamma=3, tree=8)
        assert out.error is None and out.token_ids == expected, f"mirror with trees differs from vanilla on {prompt[:60]!r}"
        assert all(s.tree is not None for s in out.trace.steps[1:])
        copied += sum(s.rendezvous.copied for s in out.trace.steps[1:])
    assert copied > 0  # windows copied from the context, as one-branch trees, were verified too


def random_tree(nodes: int, gen) -> list[int]:
    """Parents of a random tree of ``nodes`` nodes (each parent before its children)."""
    return [int(torch.randint(-1, i, (1,), generator=gen)) for i in range(nodes)]


def test_the_branch_rule_keeps_its_definition_over_a_tree():
    """mirror_sd/branches.py's rule with the tree's parents (both tree steps run it) gives the
    definition's valid branches, scores and order, ties and -inf included; skipped candidates
    (children) after them, up to min(budget, T * kappa) rows."""
    from conftest import reference_branches
    from mirror_sd.branches import choose_branches as branch_rule

    gen = torch.Generator().manual_seed(1)
    for trial in range(40):
        N, kappa = 1 + trial % 7, 1 + trial % 4
        parents = random_tree(N, gen)
        draft = torch.randint(0, 6, (N,), generator=gen).tolist()  # few tokens: children often among candidates
        top_ids = torch.stack([torch.randperm(8, generator=gen)[:kappa] for _ in range(N + 1)])
        top_logp = torch.randn(N + 1, kappa, generator=gen).sort(dim=-1, descending=True).values
        top_logp[:, -1] = top_logp[:, 0] if trial % 3 == 0 else top_logp[:, -1]  # ties
        window_logp = torch.randn(N, generator=gen)
        if trial % 5 == 0:
            window_logp[0] = float("-inf")
        for budget in (1, 3, 64):
            expected = reference_branches(draft, top_ids, top_logp, window_logp, budget, parents)
            r, roots, scores, valid = branch_rule(draft, top_ids, top_logp, window_logp, budget, parents)
            assert len(r) == min(budget, (N + 1) * kappa) and valid.sum() == len(expected)
            assert not valid[len(expected):].any()
            assert expected == list(zip(r.tolist(), roots.tolist(), scores.tolist()))[:len(expected)]


def test_a_queued_tree_step_commits_and_records_what_the_host_s_does(tiny_dirs):
    """Queued steps (``queue_steps`` "on") queue each tree step on the lanes' streams (on a GPU: one wait,
    at the rendezvous; here the same work in turn on one thread): vanilla's tokens, and every step's
    window, candidates, branches, their trees and hit as the lanes' threads ("off") record them."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    for prompt in ("t4 t4 t4 t4", "t1 t2 t3"):
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
        runs = {}
        for queued in (0, 1):
            pair.queue_steps = ("off", "on")[queued]
            out = generate(pair, prompt, method="mirror", max_new_tokens=32, raw=True, gamma=3, tree=6, kappa=3,
                           exit_layer=1)
            assert out.error is None and out.token_ids == expected
            runs[queued] = [(s.rendezvous, s.tree) for s in out.trace.steps[1:]]
        assert runs[0] == runs[1] and any(r.hit for r, _ in runs[1])


def test_a_near_tie_in_the_draft_grows_the_same_tree_on_both_paths(tiny_dirs, tmp_path):
    """Two of the draft's tokens (5 and 7) get LM-head rows equal up to rounding, so their log-probs
    tie at every rollout forward up to the last bits. The step on the lanes' threads and the queued
    step (``queue_steps`` "off" and "on") hand the draft the same rows (the branch rule's B rows,
    skipped ones included: one forward shape) and grow the same trees with the same rule
    (``grow_fields``), so the near tie is settled alike on any processor: the same rollout inputs,
    nodes and scores, step by step."""
    import shutil

    from safetensors.torch import load_file, save_file

    from mirror_sd.methods import mirror_rollouts as mirror_tree

    folder = tmp_path / "near-tie-draft"
    shutil.copytree(tiny_dirs["reduced_draft"], folder)
    state = load_file(folder / "model.safetensors")
    head = state["lm_head.weight"]  # rows of tokens [0, 2, 3, 5, 7, 8, 11, 13]
    head[4] = head[3] * (1 + 2 ** -22)  # token 7's row: token 5's, a few bits apart
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(folder))

    roll_out_trees, rollouts = mirror_tree.roll_out_trees, []

    def recorded(run, cache, window, r, roots, *args):
        trees = roll_out_trees(run, cache, window, r, roots, *args)
        rows = min(16, (len(window.tokens) + 1) * 3)  # B = min(branch_budget, T * kappa): every path's rows
        assert len(r) == rows, f"rolled out {len(r)} rows, the rule's B is {rows}"
        rollouts[-1].append((r.tolist(), roots.tolist(), [(t.tokens, t.parents, t.scores) for t in trees]))
        return trees

    mirror_tree.roll_out_trees = recorded
    try:
        for prompt in ("t1 t2 t3", "t4 t4 t4 t4"):
            expected = generate(pair, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
            runs = {}
            for queued in (0, 1):
                rollouts.append([])
                pair.queue_steps = ("off", "on")[queued]
                out = generate(pair, prompt, method="mirror", max_new_tokens=32, raw=True, gamma=3, tree=6,
                               kappa=3, exit_layer=1)
                assert out.error is None and out.token_ids == expected
                runs[queued] = [(s.rendezvous, s.tree) for s in out.trace.steps[1:]]
            host, queued = rollouts[-2], rollouts[-1]
            assert host == queued and runs[0] == runs[1]
            siblings = [(tokens, parents, scores) for _, _, trees in host for tokens, parents, scores in trees]
            tied = [(p, s) for tokens, parents, scores in siblings for i, (t, p, s) in
                    enumerate(zip(tokens, parents, scores)) if t == 5
                    and any(u == 7 and q == p and abs(v - s) < 1e-3 for u, q, v in zip(tokens, parents, scores))]
            assert tied, "the near tie never met in a rolled-out tree"
    finally:
        mirror_tree.roll_out_trees = roll_out_trees
