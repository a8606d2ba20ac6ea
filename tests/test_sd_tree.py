"""sd's draft tree (``tree`` > 0): the draft grows EAGLE-2's dynamic tree (drafting/tree.py:
grow_tree), the target verifies it in one forward, and at temperature 0 it commits vanilla's tokens."""
import math

import pytest
import torch

from conftest import EQUALITY_TOKENS
from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.drafting.tree import grow_tree


def test_grow_tree_expands_the_best_nodes_each_seeing_its_ancestors():
    first = torch.tensor([0.05, 0.3, 0.05, 0.6]).log()  # the root's children: token 3, then 1
    fed = []

    def expand(trees, nodes, parents, tokens, depth, mask):
        fed.append((nodes.tolist(), parents.tolist(), tokens.tolist(), depth, mask))
        logp = torch.empty(len(tokens), 4)
        for row, t in enumerate(tokens.tolist()):  # each node's children: t + 1 (0.6), t + 2 (0.25), the rest less
            logp[row, [(t + 1) % 4, (t + 2) % 4, (t + 3) % 4, t]] = torch.tensor([0.6, 0.25, 0.1, 0.05]).log()
        return logp

    tree = grow_tree(first, expand, lambda rows: rows, depth=3, top_k=2, total_tokens=5, base=10)
    # nodes by score: 3 (0.6), 3>0 (0.36), 1 (0.3), 3>0>1 (0.216), 1>2 (0.18); kept in creation order
    assert tree.tokens == [3, 1, 0, 2, 1]
    assert tree.parents == [-1, -1, 0, 1, 2] and tree.depths == [1, 1, 2, 2, 3]
    assert math.isclose(tree.scores[-1], math.log(0.6 * 0.6 * 0.6), abs_tol=1e-4)
    # level 2 fed the root's two children; level 3 the two best of level 2 (3>0 and 1>2), not 3>1
    assert [(n, p, t, d) for n, p, t, d, _ in fed] == [([0, 1], [-1, -1], [3, 1], 1), ([2, 4], [0, 1], [0, 2], 2)]
    first_mask, second_mask = fed[0][4], fed[1][4]
    assert first_mask.shape == (2, 12) and second_mask.shape == (2, 14)
    assert first_mask[:, :10].all() and first_mask[0, 10:].tolist() == [True, False]
    assert second_mask[:, :10].all()
    assert second_mask[0, 10:].tolist() == [True, False, True, False]  # 3>0 sees 3 (slot 10) and itself (12)
    assert second_mask[1, 10:].tolist() == [False, True, False, True]  # 1>2 sees 1 (slot 11) and itself (13)


def off_chain(steps) -> int:
    """Accepted tree nodes that are not their parent's most likely child (the first one made): tokens
    the draft's chain would not have proposed."""
    count = 0
    for step in steps:
        first_child = {}
        for node, parent in enumerate(step.tree.parents):
            first_child.setdefault(parent, node)
        count += sum(first_child[step.tree.parents[node]] != node for node in step.tree.path)
    return count


def test_sd_with_a_tree_commits_vanillas_tokens(tiny_dirs):
    prompts = ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7"]
    variants = [dict(gamma=3, tree=6), dict(gamma=2, tree=3, branching=2), dict(gamma=5, tree=20, branching=3),
                dict(gamma=1, tree=4)]
    for draft in ("draft", "reduced_draft"):  # a draft with the target's head, and one over 8 of its 16 tokens
        pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs[draft]))
        expected = [generate(pair, p, method="vanilla", max_new_tokens=24, raw=True).token_ids for p in prompts]
        beyond_the_chain = 0
        for options in variants:
            for prompt, tokens in zip(prompts, expected):
                out = generate(pair, prompt, method="sd", max_new_tokens=24, raw=True, **options)
                assert out.error is None and out.token_ids == tokens, f"sd {options} with {draft} on {prompt!r}"
                steps = out.trace.steps[1:]
                assert all(s.tree is not None and len(s.proposed) <= options["tree"] for s in steps)
                assert all(max(s.tree.depths) <= options["gamma"] for s in steps)
                beyond_the_chain += off_chain(steps)
        assert beyond_the_chain > 0  # the tree's other branches were accepted, not only its top chain


def test_sd_trees_are_refused_at_temperature_above_zero(tiny_pair):
    with pytest.raises(MirrorSDError, match="tree works at temperature 0 only"):
        generate(tiny_pair, "t1 t2 t3", method="sd", max_new_tokens=16, raw=True, temperature=1.0, gamma=3, tree=8)


def test_a_tree_is_refused_with_copies_or_another_drafter(tiny_pair):
    with pytest.raises(MirrorSDError, match="copy_below works on a chain"):
        generate(tiny_pair, "t1", method="sd", max_new_tokens=4, raw=True, tree=8, copy_below=0.5)
    with pytest.raises(MirrorSDError, match="tree applies with streams=0 only"):
        generate(tiny_pair, "t1", method="sd", max_new_tokens=4, raw=True, streams=1, tree=8)


def test_the_shipped_draft_s_tree_commits_vanillas_tokens(embedded_pair, equality_prompts, vanilla_reference):
    for prompt, expected in list(zip(equality_prompts, vanilla_reference))[:2]:
        out = generate(embedded_pair, prompt, method="sd", max_new_tokens=EQUALITY_TOKENS, gamma=3, tree=8)
        assert out.error is None and out.token_ids == expected, f"sd with a tree differs from vanilla on {prompt[:60]!r}"
        assert all(s.tree is not None and len(s.proposed) == 8 for s in out.trace.steps[1:])
