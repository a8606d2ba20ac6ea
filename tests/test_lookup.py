"""Context lookup (drafting/lookup.py): grafting its copy onto a draft tree (tree.graft), and sd's
draft proposing it where it is unsure (``copy_below``)."""
import pytest
import torch

from mirror_sd import MirrorSDError, generate
from mirror_sd.drafting.lookup import copy_from_context
from mirror_sd.drafting.token_by_token import unsure_copy
from mirror_sd.drafting.tree import Tree, graft, tree_mask, tree_positions
from test_distribution import chi_square_p, exact_law_of_tokens_2_and_3, sample_counts

# t1 followed by every token, then t1: whatever token comes next, the last 2 tokens occurred before
REPEATING_PROMPT = " ".join(f"t1 t{k}" for k in range(16)) + " t1"


def test_copy_takes_what_followed_the_latest_longest_match():
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # the last 3 tokens (5 2 3) never occurred before; the last 2 (2 3) did, latest at index 6
    assert copy_from_context(seq, 4) == [7, 8, 5, 2]
    assert copy_from_context(seq + [7], 3) == [8, 5, 2]  # 2 3 7 occurred: the 3-gram wins
    assert copy_from_context(seq, 1) == [7]
    assert copy_from_context(seq, 0) == []
    assert copy_from_context([4, 5, 6, 7], 3) == []  # nothing repeats
    assert copy_from_context([1, 2], 3) == []  # too short for any n-gram with something after it
    assert copy_from_context([5, 5, 5, 5], 3) == [5]  # a repeat copies up to the sequence's end
    assert copy_from_context([1, 7, 9, 4, 2, 7], 2) == [9, 4]  # no 2-gram repeats: the last token alone matches


def test_graft_reuses_the_trees_nodes_and_appends_the_rest():
    # root -> 10, 11;  10 -> 20
    tree = Tree([10, 11, 20], [-1, -1, 0], [1, 1, 2], [-0.1, -1.0, -0.5])
    grafted = graft(tree, [10, 20, 30, 40])  # follows 10 -> 20, then two new nodes
    assert grafted.tokens == [10, 11, 20, 30, 40]
    assert grafted.parents == [-1, -1, 0, 2, 3]
    assert grafted.depths == [1, 1, 2, 3, 4]
    assert grafted.copied == [3, 4] and grafted.scores[3:] == [None, None]
    assert tree.tokens == [10, 11, 20]  # the original is untouched

    fresh = graft(tree, [12, 13])  # no shared prefix: a new branch from the root
    assert fresh.parents[3:] == [-1, 3] and fresh.depths[3:] == [1, 2] and fresh.copied == [3, 4]
    assert graft(tree, [11]).tokens == tree.tokens and graft(tree, []).copied == []  # nothing new

    # the verify window sees the copied branch as a tree: node 40 attends to root, 10, 20, 30 and itself
    mask = tree_mask(grafted.parents)
    assert mask[5].tolist() == [True, True, False, True, True, True]
    assert tree_positions(grafted.depths, 7).tolist() == [[7, 8, 8, 9, 10, 11]]
    assert grafted.children() == {-1: [0, 1], 0: [2], 2: [3], 3: [4]}
    assert grafted.record([0, 2, 3]).copied == [3, 4]


def test_the_app_draws_and_explains_copied_nodes():
    from app import figures
    from app.explain import explain
    from app.tokens import COPIED_STYLE, copied_marks, legend_html, step_html
    from app.trees import ACCEPTED, COPIED, step_tree
    from mirror_sd.trace import Rendezvous, Step, Trace

    tree = graft(Tree([10, 11], [-1, -1], [1, 1], [-0.1, -1.0]), [10, 12, 13])
    step = Step(1, [10, 12, 5], ["accepted", "accepted", "correction"], proposed=tree.tokens, accepted=2,
                tree=tree.record([0, 2]))
    kinds = [n.kind for n in step_tree(step)]
    assert kinds == ["root", ACCEPTED, "draft node", ACCEPTED, COPIED]
    fig = figures.tree(step, {t: f"t{t}" for t in range(16)})
    assert COPIED in {d.name for d in fig.data}
    trace = Trace("eagle", {})
    trace.add_step(Step(0, [10], ["target"]))
    trace.add_step(step)
    assert "2 of the draft tokens were copied from the context" in explain(trace, 1, {})
    assert "1 of them was accepted" in explain(trace, 1, {})
    html = step_html(step, {t: f"t{t}" for t in range(16)})  # t10 drafted, t12 copied, then t13 copied, rejected
    assert copied_marks(step) == ([False, True], [True])
    assert html.count(COPIED_STYLE) == 2 and html.index(COPIED_STYLE) > html.index(">t10<")
    assert COPIED_STYLE in legend_html()
    window = Step(2, [7, 8], ["accepted", "correction"], proposed=[7, 9], accepted=1,
                  rendezvous=Rendezvous([[7], [9]], [], None, fallback=False, copied=True))
    assert copied_marks(window) == ([True], [True])  # mirror: a whole window copied after a miss
    assert torch.equal(tree_mask(tree.parents)[4], torch.tensor([True, True, False, True, True]))


def test_an_unsure_draft_proposes_what_the_context_continues_with():
    seq = [1, 2, 3, 9, 1, 2]  # the last 2 tokens occurred before, followed by 3
    logits = torch.tensor([2.0, 1.0, 0.0, 0.0])  # the draft's top-1 probability: 0.61
    assert unsure_copy(seq, logits, None, 0.9) == 3
    assert unsure_copy(seq, logits, None, 0.5) is None  # sure enough: its own token stands
    assert unsure_copy(seq, logits, None, 0.0) is None  # off
    assert unsure_copy([4, 1, 5, 1], logits, None, 0.9) is None  # only the last token repeats: no copy
    sure = torch.tensor([0.95, 0.05, 0.0, 0.0])  # at T > 0 the law it draws from decides
    assert unsure_copy(seq, logits, sure, 0.9) is None and unsure_copy(seq, logits, sure, 0.99) == 3


def test_sd_with_copies_equals_vanilla_and_the_app_says_what_was_copied(tiny_pair):
    from app.explain import explain
    from app.tokens import COPIED_STYLE, copied_marks, step_html

    expected = generate(tiny_pair, REPEATING_PROMPT, method="vanilla", max_new_tokens=24, raw=True).token_ids
    out = generate(tiny_pair, REPEATING_PROMPT, method="sd", max_new_tokens=24, raw=True, gamma=4, copy_below=1.0)
    assert out.error is None and out.token_ids == expected
    steps = out.trace.steps[1:]
    assert all(0 <= i < len(s.proposed) for s in steps for i in s.draft.copied_at)
    step = next(s for s in steps if s.draft.copied_at)
    copied, used = step.draft.copied_at, sum(i < step.accepted for i in step.draft.copied_at)
    sentence = explain(out.trace, step.index, {})
    assert f"{len(copied)} of the draft tokens were copied from the context" in sentence
    assert f"{used} of them {'was' if used == 1 else 'were'} accepted" in sentence
    marks = copied_marks(step)  # the token strip underlines the same window positions
    assert [i for i, m in enumerate(marks[0] + marks[1]) if m] == copied
    html = step_html(step, {t: f"t{t}" for t in range(tiny_pair.target.args.vocab_size)})
    shown = step.accepted + (len(step.rejected) if step.origins[-1] == "correction" else 0)
    assert html.count(COPIED_STYLE) == sum(i < shown for i in copied)
    plain = generate(tiny_pair, REPEATING_PROMPT, method="sd", max_new_tokens=24, raw=True, gamma=4)
    assert plain.trace.steps[1].draft.copied_at == []  # off by default


@pytest.mark.slow
def test_sd_with_copies_samples_the_target_distribution(tiny_pair):
    """At T > 0 a copied token is proposed with a one-hot law; verify's rule must still leave the
    target's law (tokens 2 and 3 of 2,000 seeded runs, against the exact law)."""
    law = exact_law_of_tokens_2_and_3(tiny_pair.target, tiny_pair.encode(REPEATING_PROMPT, raw=True), 1.0, 1.0)
    outputs = []
    counts = sample_counts(tiny_pair, "sd", 1.0, 1.0, outputs=outputs, prompt=REPEATING_PROMPT, gamma=3,
                           copy_below=1.0)
    assert chi_square_p(counts, law) > 1e-3
    copies = sum(len(s.draft.copied_at) for out in outputs for s in out.trace.steps[1:])
    assert copies >= 2 * 2000  # every run drafted its first two tokens by copying



def test_copies_need_token_by_token_drafting(tiny_pair):
    with pytest.raises(MirrorSDError, match="copy_below applies with streams=0 only"):
        generate(tiny_pair, REPEATING_PROMPT, method="sd", max_new_tokens=4, raw=True, streams=1, copy_below=0.5)
