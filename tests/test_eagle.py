"""EAGLE-2: tree mask and positions, KV compaction to a tree path, equality with vanilla at T = 0,
the target's law at T > 0, training, and the shipped head."""
import json

import pytest
import torch

from conftest import EQUALITY_TOKENS
from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.drafting.tree import Tree, tree_mask, tree_positions
from mirror_sd.methods.verify import walk_tree_greedy
from mirror_sd.models.eagle import EMBEDDED_HEAD, EagleHead, attach_head, head_for, load_head
from test_distribution import PROMPT, chi_square_p, exact_law_of_tokens_2_and_3, sample_counts
from test_train_draft import _distilled_data

# root -> a, b;  a -> c, d;  c -> e
PARENTS = [-1, -1, 0, 0, 2]
DEPTHS = [1, 1, 2, 2, 3]


def test_tree_mask_and_positions_on_a_hand_built_tree():
    expected = torch.tensor([  # rows/cols: root, a, b, c, d, e
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 1, 0, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [1, 1, 0, 1, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(tree_mask(PARENTS), expected)
    assert tree_positions(DEPTHS, 7).tolist() == [[7, 8, 8, 9, 9, 10]]
    assert Tree([5, 6, 7, 8, 9], PARENTS, DEPTHS, [0.0] * 5).children() == {-1: [0, 1], 0: [2, 3], 2: [4]}


def test_greedy_walk_follows_the_target_argmax():
    tokens = [5, 6, 7, 8, 9]
    argmax = [5, 8, 0, 0, 2, 0]  # per row (root, then node i at i + 1): root -> a (5), a -> d (8), d a leaf: bonus 2
    logits = torch.nn.functional.one_hot(torch.tensor(argmax), 16).float()  # [N + 1, V]
    assert walk_tree_greedy(tokens, PARENTS, logits) == ([0, 3], 2)
    logits[0] = torch.nn.functional.one_hot(torch.tensor(11), 16).float()  # no child of the root matches: correction 11
    assert walk_tree_greedy(tokens, PARENTS, logits) == ([], 11)


@pytest.fixture(scope="module")
def tiny_eagle(tiny_dirs):
    """The tiny target with an untrained head over 10 of its 16 tokens."""
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    torch.manual_seed(0)
    attach_head(pair, EagleHead.from_target(pair.target, torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13])))
    return pair


def test_kv_keep_moves_a_non_contiguous_tree_path_into_place(tiny_eagle):
    """Verify a tree window, keep root + path a -> c -> e (window slots 0, 1, 3, 5): the cache then
    equals one built by running the prefix and that path in order, and decodes the same next token."""
    target = tiny_eagle.target
    prefix, root, tokens = [1, 2, 3], 4, [5, 6, 7, 8, 9]
    path = [0, 2, 4]
    with torch.no_grad():
        cache = target.new_cache(32)
        target(torch.tensor([prefix]), cache)
        n = len(prefix) + 1  # the root is the n-th token
        ids = torch.tensor([[root, *tokens]])
        target(ids, cache, positions=tree_positions(DEPTHS, n - 1), tree_mask=tree_mask(PARENTS), commit=False)
        cache.keep([n - 1] + [n + i for i in path], at=n - 1)
        reference = target.new_cache(32)
        target(torch.tensor([prefix + [root] + [tokens[i] for i in path]]), reference)
        assert cache.length == reference.length == len(prefix) + 1 + len(path)
        L = cache.length
        assert torch.allclose(cache.k[:, :, :, :L], reference.k[:, :, :, :L], atol=1e-5)
        assert torch.allclose(cache.v[:, :, :, :L], reference.v[:, :, :, :L], atol=1e-5)
        a, b = target(torch.tensor([[10]]), cache), target(torch.tensor([[10]]), reference)
        assert torch.allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("depth,top_k,total_tokens,lookup", [(3, 4, 10, 0), (5, 8, 30, 0), (1, 1, 1, 0), (2, 2, 3, 6)])
def test_eagle_equals_vanilla_on_a_tiny_target(tiny_eagle, depth, top_k, total_tokens, lookup):
    origins, copied_accepted = set(), 0
    for prompt in ["t1 t2 t3", "t9", "t4 t4 t4 t4", "t15 t0 t7"]:
        expected = generate(tiny_eagle, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
        out = generate(tiny_eagle, prompt, method="eagle", max_new_tokens=24, raw=True, depth=depth, top_k=top_k,
                       total_tokens=total_tokens, lookup=lookup)
        assert out.error is None and out.token_ids == expected
        for step in out.trace.steps[1:]:
            tree = step.tree
            drafted = [i for i in range(len(tree.tokens)) if i not in tree.copied]
            assert len(drafted) <= total_tokens and max(tree.depths[i] for i in drafted) <= depth
            assert len(tree.copied) <= lookup
            path_tokens = [tree.tokens[i] for i in tree.path]
            assert step.committed[:step.accepted] == path_tokens[:step.accepted]
            assert len(path_tokens) == step.accepted or step is out.trace.steps[-1]  # the last step may be cut
            copied_accepted += sum(i in tree.copied for i in tree.path)
        origins |= {o for s in out.trace.steps for o in s.origins}
        assert {s.kind for s in out.trace.spans} == {"prefill", "draft", "verify"}
        assert len({s.lane for s in out.trace.spans}) == 1  # everything on the target's lane
    assert {"accepted", "correction"} <= origins
    assert (copied_accepted > 0) == (lookup > 0)  # copied tokens were verified and some accepted


def test_eagle_samples_the_target_distribution(tiny_dirs, tiny_eagle):
    """T > 0: a sampled chain verified with speculative sampling; counts of tokens 2 and 3 over
    seeded runs fit the exact law, and the same test rejects the law at another temperature."""
    prompt_ids = tiny_eagle.encode(PROMPT, raw=True)
    law = exact_law_of_tokens_2_and_3(tiny_eagle.target, prompt_ids, 1.0, 1.0)
    outputs = []
    counts = sample_counts(tiny_eagle, "eagle", 1.0, 1.0, outputs=outputs, depth=2)
    assert chi_square_p(counts, law) > 1e-3
    steps = [s for out in outputs for s in out.trace.steps[1:]]
    assert {0, 1, 2} <= {s.accepted for s in steps}  # rejections at each position, and full acceptance
    other = exact_law_of_tokens_2_and_3(tiny_eagle.target, prompt_ids, 0.6, 1.0)
    assert chi_square_p(counts, other) < 1e-6  # the test has the power to tell laws apart


def test_eagle_needs_a_head_for_other_targets(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    with pytest.raises(MirrorSDError, match="needs an EAGLE head"):
        generate(pair, "t1 t2", method="eagle", max_new_tokens=4, raw=True)


def test_unrolled_training_passes_are_what_drafting_computes(tiny_eagle):
    """Training-time test: pass s at position p equals the head's output at depth s of a chain
    drafted from anchor p - s + 1 with the cache the decoder keeps (true tokens on the way)."""
    from mirror_sd.methods.eagle import head_step
    from mirror_sd.train.eagle import unrolled_predictions

    from mirror_sd.models.linear import convert_to_int8

    head = convert_to_int8(head_for(tiny_eagle), False)  # as training multiplies: fp32, not drafting's int8
    torch.manual_seed(1)
    T, anchor = 9, 4
    feats = torch.randn(1, T, head.args.hidden_size)
    ids = torch.randint(0, 16, (1, T))
    with torch.no_grad():
        passes = unrolled_predictions(head, feats, ids, unroll=3)
        cache = head.new_cache(T + 4)
        out = head_step(head, cache, feats[0, :anchor + 1], ids[0, :anchor + 1].tolist())[-1]  # true pairs
        torch.testing.assert_close(out, passes[0][0, anchor])
        for s in (2, 3):  # the chain: its own prediction, the true next token, position anchor + s - 1
            p = anchor + s - 1
            out = head_step(head, cache, out[None], [int(ids[0, p])], torch.tensor([[p]]))[0]
            torch.testing.assert_close(out, passes[s - 1][0, p], atol=1e-5, rtol=1e-4)


def test_early_features_are_the_hidden_state_entering_the_layer_through_its_norm(tiny_dirs):
    """Checked against transformers' own forward (``output_hidden_states``): hidden_states[l] is what
    enters layer l; the final feature is unchanged by reading early layers on the way."""
    from transformers import AutoModelForCausalLM

    from mirror_sd.train.features import causal_features

    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    ids = torch.tensor([[1, 5, 2, 9, 4, 4, 7]])
    feats, argmax, early = causal_features(pair.target, ids, (1,))
    plain, _, none = causal_features(pair.target, ids)
    assert none is None and torch.equal(feats, plain)
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_dirs["target"]), torch_dtype=torch.float32)
    with torch.no_grad():
        hidden = hf(ids, output_hidden_states=True).hidden_states
        expected = hf.model.layers[1].input_layernorm(hidden[1])
    torch.testing.assert_close(early, expected, atol=1e-5, rtol=1e-4)
    with pytest.raises(MirrorSDError, match="early layers must be increasing"):
        EagleHead.from_target(pair.target, torch.arange(8), (2,))  # the tiny target has layers 0 and 1


def test_a_head_reading_early_features_starts_as_it_was_and_stays_lossless(tiny_dirs, tmp_path):
    from mirror_sd.models.eagle import save_head

    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    torch.manual_seed(3)
    plain = EagleHead.from_target(pair.target, torch.tensor([0, 1, 2, 3, 4, 5, 7, 8, 11, 13])).eval()
    fused = plain.with_early_layers(pair.target, (1,)).eval()
    d = plain.args.hidden_size
    feats, ids, early = torch.randn(1, 6, d), torch.randint(0, 16, (1, 6)), torch.randn(1, 6, d)
    with torch.no_grad():
        torch.testing.assert_close(fused(feats, ids, None, early=early), plain(feats, ids, None))  # fuse starts at 0
        torch.nn.init.normal_(fused.fuse.weight, std=0.5)
        assert not torch.allclose(fused(feats, ids, None, early=early), plain(feats, ids, None))  # now it reads them
    save_head(fused, tmp_path / "fused", dict(target="tiny"))
    loaded = load_head(tmp_path / "fused", pair.target)
    assert loaded.early_layers == (1,) and json.loads((tmp_path / "fused" / "config.json").read_text())["early_layers"] == [1]
    attach_head(pair, loaded)
    for prompt in ["t1 t2 t3", "t4 t4 t4 t4", "t15 t0 t7"]:
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=20, raw=True).token_ids
        out = generate(pair, prompt, method="eagle", max_new_tokens=20, raw=True, depth=3, top_k=3, total_tokens=8)
        assert out.error is None and out.token_ids == expected


def test_training_on_a_device_this_machine_lacks_is_a_clear_error(tiny_dirs, tmp_path):
    from mirror_sd.train.eagle import train

    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a cuda:3")
    with pytest.raises(MirrorSDError, match="device 'cuda:3' is not available"):
        train(tmp_path, tmp_path / "head", target_dir=tiny_dirs["target"], device="cuda:3")


def test_short_eagle_training_lowers_the_loss(tiny_dirs, tiny_pair, tmp_path):
    from mirror_sd.train.eagle import train

    data = _distilled_data(tiny_pair, tmp_path / "data")
    out = tmp_path / "head"
    card = train(data, out, features=tmp_path / "features", vocab_size=12, epochs=20, lr=3e-3, batch_tokens=512,
                 eval_every=10, holdout=0.2, threads=1, target_dir=tiny_dirs["target"])
    history = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert evals[-1] < 0.8 * evals[0]
    assert (out / "loss.png").stat().st_size > 0 and card["head_vocabulary"] == 12
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    attach_head(pair, load_head(out, pair.target))
    vanilla = generate(pair, "t3 t1 t4", method="vanilla", max_new_tokens=16, raw=True).token_ids
    assert generate(pair, "t3 t1 t4", method="eagle", max_new_tokens=16, raw=True).token_ids == vanilla

    # training-time test, going on from that head: it keeps the head's rows, and the unrolled objective falls
    card = train(data, tmp_path / "ttt", features=tmp_path / "features", epochs=6, lr=3e-3, batch_tokens=512,
                 eval_every=5, holdout=0.2, threads=1, target_dir=tiny_dirs["target"], unroll=2, init=out)
    history = json.loads((tmp_path / "ttt" / "metrics.json").read_text())
    objective = [h["train_loss"] for h in history if "train_loss" in h]
    assert card["unroll"] == 2 and card["head_vocabulary"] == 12 and len(card["held_out_top1_by_depth"]) == 3
    assert [stage["unroll"] for stage in card["stages"]] == [1, 2]  # the model card lists both stages
    assert [stage["data"] for stage in card["stages"]] == [["data"], ["data"]]  # ... with the data each read
    readme = (tmp_path / "ttt" / "README.md").read_text()
    assert "`data`: Prompts from offline corpora (`mirror_sd/train/prompts.py`), answers written by the target" in readme and readme.count(" on `data`: ") == 2
    assert sum(objective[-3:]) < sum(objective[:3])

    # early features (EAGLE-3's fusion), going on from the trained head: the fuse weights learn
    card = train(data, tmp_path / "early", features=tmp_path / "features", epochs=4, lr=3e-3, batch_tokens=512,
                 eval_every=5, holdout=0.2, threads=1, target_dir=tiny_dirs["target"], unroll=2, init=tmp_path / "ttt",
                 early_layers=[1])
    fused = load_head(tmp_path / "early", pair.target)
    assert card["early_layers"] == [1] and fused.early_layers == (1,) and fused.fuse.weight.abs().sum() > 0
    assert "Early features" in (tmp_path / "early" / "README.md").read_text()
    attach_head(pair, fused)
    assert generate(pair, "t3 t1 t4", method="eagle", max_new_tokens=16, raw=True).token_ids == vanilla
    with pytest.raises(MirrorSDError, match="cannot go on with"):
        train(data, tmp_path / "other", features=tmp_path / "features", epochs=1, target_dir=tiny_dirs["target"],
              init=tmp_path / "early", early_layers=[])
    with pytest.raises(MirrorSDError, match="early layers must be increasing"):  # before any feature is computed
        train(data, tmp_path / "bad", features=tmp_path / "bad-features", epochs=1, target_dir=tiny_dirs["target"],
              early_layers=[5])
    assert not (tmp_path / "bad-features").exists()


TAU_3_TREE = dict(depth=6, top_k=6, total_tokens=32)  # README, EAGLE-2: tau 3.07 at 1.11x vanilla


@pytest.mark.skipif(not (EMBEDDED_HEAD / "model.safetensors").exists(), reason="the trained head is not shipped yet")
def test_shipped_head_equals_vanilla_on_varied_prompts(embedded_pair, equality_prompts, vanilla_reference):
    assert len(equality_prompts) >= 12
    head_for(embedded_pair)  # the shipped head loads for the embedded target
    committed, steps, origins = 0, 0, set()
    for i, (prompt, expected) in enumerate(zip(equality_prompts, vanilla_reference)):
        tree = {} if i % 2 == 0 else TAU_3_TREE  # every other prompt: the README's tau >= 3 setting
        out = generate(embedded_pair, prompt, method="eagle", max_new_tokens=EQUALITY_TOKENS, **tree)
        assert out.error is None
        assert out.token_ids == expected, f"eagle {tree} differs from vanilla on {prompt[:60]!r}"
        committed, steps = committed + out.metrics["new_tokens"] - 1, steps + out.metrics["steps"]
        origins |= {o for step in out.trace.steps for o in step.origins}
    assert {"accepted", "correction", "bonus"} <= origins
    # the trained head pays its way in tokens: well over one token per target forward (measured ~1.6-1.8)
    assert committed / steps > 1.4
    if embedded_pair.int8_drafting:  # the head drafted in int8 (models/linear.py), its input map in fp32
        head = head_for(embedded_pair)
        assert hasattr(head.layer.mlp.down_proj.weight, "_int8_packed")
        assert not hasattr(head.fc.weight, "_int8_packed")


def test_the_app_draws_a_real_eagle_tree(tiny_eagle):
    from app import figures
    from app.trees import ACCEPTED, ROOT, step_tree

    out = generate(tiny_eagle, "t1 t2 t3", method="eagle", max_new_tokens=12, raw=True, depth=3, top_k=2,
                   total_tokens=6)
    step = out.trace.steps[1]
    nodes = step_tree(step)
    tree = step.tree
    assert nodes[0].kind == ROOT and len(nodes) == len(tree.tokens) + 1
    assert [n.token for n in nodes if n.kind == ACCEPTED] == [tree.tokens[i] for i in tree.path]
    fig = figures.tree(step, {t: f"t{t}" for t in range(16)})
    assert sum(len(d.x) for d in fig.data if d.mode != "lines") == len(nodes)
