"""Speculative Streaming: stream masks, the untouched main stream, training, and losslessness."""
import json
import random

import pytest
import torch

from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.drafting.tree import stream_tree
from mirror_sd.drafting.tree import tree_mask, tree_positions
from mirror_sd.models.streams import StreamConfig, Streams, forward_with_streams, split_forward, stream_mask, target_streams, use_streams
from mirror_sd.train.draft import read_examples
from mirror_sd.train.ss import answer_positions, greedy_continuations, load_frozen, sequences, train

from test_distribution import PROMPT, chi_square_p, exact_law_of_tokens_2_and_3, sample_counts
from test_train_draft import _distilled_data


def random_streams(model, layers=1, G=3, seed=0):
    torch.manual_seed(seed)
    streams = Streams(model.args, StreamConfig(num_streams=G, stream_layers=layers, rank=4))
    with torch.no_grad():
        for p in streams.lora_b.values():
            p.normal_(0, 0.1)  # untrained LoRA starts at zero: make it act
    return streams.attach(model)


def test_stream_mask_layout():
    mask = stream_mask(torch.tensor([[1, 3]]), start=5, G=2)[0].int()  # rows (r, j): (0,1) (0,2) (1,1) (1,2)
    assert mask.tolist() == [[1, 1, 0, 0, 0, 1, 0, 0, 0],
                             [1, 1, 0, 0, 0, 1, 1, 0, 0],
                             [1, 1, 1, 1, 0, 0, 0, 1, 0],
                             [1, 1, 1, 1, 0, 0, 0, 1, 1]]


def test_stream_rows_see_only_their_past_and_earlier_streams(tiny_pair):
    """Batched streams of several rows equal each row's streams alone; later slots do not leak in."""
    model = tiny_pair.target
    streams = random_streams(model, layers=2)
    ids = torch.tensor([[1, 5, 2, 9, 4, 7, 3]])
    cache = model.new_cache(32)
    with torch.no_grad():
        _, h0 = split_forward(model, ids, cache, streams.first_layer)
        cache.length = ids.shape[1]
        at = torch.tensor([[2, 4, 6]])
        together = streams(model, cache, h0[:, at[0]], at)  # [1, 3, G, V]
        for r, t in enumerate(at[0].tolist()):
            alone_cache = model.new_cache(32)
            _, h0_prefix = split_forward(model, ids[:, :t + 1], alone_cache, streams.first_layer)
            alone_cache.length = t + 1
            alone = streams(model, alone_cache, h0_prefix[:, -1:], torch.tensor([[t]]))
            torch.testing.assert_close(together[:, r], alone[:, 0], atol=1e-5, rtol=1e-5)
        # stream j does not see streams after j: dropping the last stream leaves the others unchanged
        fewer = Streams(model.args, StreamConfig(2, 2, 4))
        fewer.load_state_dict({k: v[:2] if k == "embeddings" else v for k, v in streams.state_dict().items()})
        fewer.attach(model)
        torch.testing.assert_close(fewer(model, cache, h0[:, at[0]], at), together[:, :, :2], atol=1e-5, rtol=1e-5)


def test_main_stream_is_the_frozen_target(tiny_pair):
    """Logits of the split forward equal the plain forward, and streams leave the cache untouched."""
    model = tiny_pair.target
    streams = random_streams(model)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.no_grad():
        plain = model(ids, model.new_cache(32))
        cache = model.new_cache(32)
        logits, h0 = split_forward(model, ids, cache, streams.first_layer)
        cache.length = ids.shape[1]
        before = cache.k.clone(), cache.v.clone()
        streams(model, cache, h0[:, -1:], torch.tensor([[ids.shape[1] - 1]]))
    assert torch.equal(logits, plain)
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1]) and cache.length == ids.shape[1]


def test_streams_in_the_verify_forward_equal_a_pass_of_their_own(tiny_pair):
    """forward_with_streams (the single pass): over a tree window after a cached prefix, the main
    logits and the stored keys/values are the tree-masked forward's, and each row's stream logits
    are what the streams compute in a forward of their own against that cache."""
    model = tiny_pair.target
    streams = random_streams(model, layers=2, G=3)
    prefix, window = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[9, 2, 6, 5, 3]])  # root + 4 tree nodes
    parents, depths = [-1, -1, 0, 2], [1, 1, 2, 3]
    positions = tree_positions(depths, prefix.shape[1])
    with torch.no_grad():
        caches = []
        for _ in range(2):
            cache = model.new_cache(32)
            model(prefix, cache)
            caches.append(cache)
        main, h0 = split_forward(model, window, caches[0], streams.first_layer, positions, tree_mask(parents))
        joint_main, joint_streams = forward_with_streams(model, streams, window, caches[1], gamma=3,
                                                         positions=positions, tree_mask=tree_mask(parents))
        torch.testing.assert_close(joint_main, main, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(caches[1].k, caches[0].k, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(caches[1].v, caches[0].v, atol=1e-6, rtol=1e-6)
        start, T = prefix.shape[1], window.shape[1]
        seen = model.window(caches[0], T, positions, tree_mask(parents)).mask[:, 0]  # [1, T, start + T]
        caches[0].length = start + T
        alone = streams(model, caches[0], h0, start + torch.arange(T)[None], positions, seen)  # [1, T, G, V]
        torch.testing.assert_close(joint_streams, alone, atol=1e-5, rtol=1e-5)
        two = forward_with_streams(model, streams, window, caches[1], gamma=2, rows=[0, 3],
                                   positions=positions, tree_mask=tree_mask(parents))[1]
        torch.testing.assert_close(two, alone[:, [0, 3], :2], atol=1e-5, rtol=1e-5)  # some rows, first streams
        assert not torch.equal(alone[:, 0], alone[:, 3])


@pytest.fixture(scope="module")
def trained_tiny(tiny_dirs, tiny_pair, tmp_path_factory):
    """Streams trained briefly on the tiny target's own answers."""
    root = tmp_path_factory.mktemp("ss")
    data = _distilled_data(tiny_pair, root / "data")
    out = root / "streams"
    return out, train_tiny_streams(data, out, tiny_dirs, next_token_rank=4)  # streams see x[t+1] too


def train_tiny_streams(data, out, tiny_dirs, next_token_rank: int) -> dict:
    """A short training run of 3 streams on the tiny target's top layer; its card."""
    config = StreamConfig(num_streams=3, stream_layers=1, rank=4, next_token_rank=next_token_rank)
    return train(data, out, config, vocab_size=16, epochs=40, lr=1e-2, batch_size=8, positions=16, eval_every=20,
                 holdout=0.2, threads=1, target_dir=tiny_dirs["target"])


def test_short_training_run_lowers_the_loss_and_loads(trained_tiny, tiny_dirs):
    out, card = trained_tiny
    history = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert evals[-1] < 0.8 * evals[0]
    assert (out / "loss.png").stat().st_size > 0
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    streams = use_streams(pair, out)
    assert streams.num_parameters() == card["trainable_parameters"] and streams.num_streams == 3


def test_training_goes_on_from_trained_streams(trained_tiny, tiny_dirs, tmp_path):
    """--init: a second stage starts from the trained streams (their config and head rows), not from scratch,
    and the card lists both stages."""
    first, card = trained_tiny
    data = first.parent / "data"
    other = StreamConfig(num_streams=2, stream_layers=1, rank=2)  # ignored: the init's config is kept
    again = train(data, tmp_path / "stage2", other, epochs=1, lr=1e-9, batch_size=8, positions=16, eval_every=100,
                  holdout=0.2, threads=1, target_dir=tiny_dirs["target"], init=first)
    before, after = (json.loads((d / "streams.json").read_text()) for d in (first, tmp_path / "stage2"))
    assert after["config"] == before["config"]
    assert [s["steps"] for s in again["stages"]] == [card["steps"], again["steps"]]
    assert again["held_out_loss"] == pytest.approx(card["held_out_loss"], rel=1e-3)  # lr ~0: the same streams
    assert "Stages" in (tmp_path / "stage2" / "README.md").read_text()


def test_training_on_a_device_this_machine_lacks_is_a_clear_error(trained_tiny, tiny_dirs, tmp_path):
    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a cuda:3")
    data = trained_tiny[0].parent / "data"
    with pytest.raises(MirrorSDError, match="device 'cuda:3' is not available"):
        train(data, tmp_path / "streams", StreamConfig(num_streams=2, stream_layers=1, rank=2), epochs=1,
              target_dir=tiny_dirs["target"], device="cuda:3")


def test_streams_can_learn_the_models_own_continuation(tiny_pair, tiny_dirs, tmp_path):
    """--labels own (a draft's streams for sd with streams=2): stream j learns the frozen model's own
    greedy token j + 1 places ahead (train/ss.py: own_continuations), and the held-out loss falls.
    The answers are then only context, so a folder of reference answers serves."""
    data = _distilled_data(tiny_pair, tmp_path / "data")
    (data / "config.json").write_text(json.dumps(dict(source="reference")))  # answers not the target's: context only
    out = tmp_path / "streams"
    config = StreamConfig(num_streams=2, stream_layers=1, rank=4)
    with pytest.raises(MirrorSDError, match="holds reference answers"):  # labels from the answers: refused
        train(data, tmp_path / "refused", config, target_dir=tiny_dirs["reduced_draft"], labels="answers")
    card = train(data, out, config, epochs=30, lr=1e-2, batch_size=8, positions=8, eval_every=20, holdout=0.2,
                 threads=1, target_dir=tiny_dirs["reduced_draft"], labels="own")
    evals = [h["eval_loss"] for h in json.loads((out / "metrics.json").read_text()) if "eval_loss" in h]
    assert evals[-1] < 0.8 * evals[0]
    readme = (out / "README.md").read_text()
    assert card["labels"] == "own" and "own greedy token" in readme and "reference answers from the same corpora" in readme
    saved = json.loads((out / "own-continuations.json").read_text())["after"]
    examples = read_examples(data)
    random.Random(0).shuffle(examples)  # the trainer's order (seed 0)
    seqs, model = sequences(examples, 512), load_frozen(tiny_dirs["reduced_draft"])[0]
    assert len(saved) == len(seqs)
    differs = 0
    for i in (0, len(seqs) - 1):  # held out (all answer positions) and trained on (8 of them)
        at = answer_positions(*seqs[i], 512 if i == 0 else 8, random.Random(i))
        assert saved[str(i)] == greedy_continuations(model, seqs[i][0], at, 3)
        differs += sum(tokens != seqs[i][0][t + 1:t + 4] for t, tokens in zip(at, saved[str(i)]))
    assert differs > 0  # the model's own continuation, not the data's tokens


def test_a_card_from_before_data_was_recorded_still_lists_its_stage():
    """--init from streams whose card has no data line (the shipped draft's streams) once failed
    writing the new card, after training."""
    from mirror_sd.train.ss import stage_line, stage_of

    old = dict(examples_train=1093, steps=411, epochs=3, lr=0.002, wall_s=600.0,
               held_out_top1_per_stream=[0.209, 0.121])
    assert stage_line(stage_of(old)).startswith("  - data not recorded (1093 examples): 411 steps")


@pytest.fixture(scope="module")
def ss_pair(trained_tiny, tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    use_streams(pair, trained_tiny[0])
    return pair


@pytest.fixture(scope="module")
def one_forward_pair(trained_tiny, tiny_dirs, tmp_path_factory):
    """The tiny target with streams trained on the same data without the next-token input (the
    paper's streams), which ride in the verify forward with one_forward=1."""
    out = tmp_path_factory.mktemp("ss-paper") / "streams"
    train_tiny_streams(trained_tiny[0].parent / "data", out, tiny_dirs, next_token_rank=0)
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    use_streams(pair, out)
    return pair


def test_stream_tree_takes_each_streams_top_k_under_the_best_nodes():
    logp = torch.tensor([[0.6, 0.3, 0.1], [0.7, 0.2, 0.1]]).log()  # [gamma 2, 3 head rows]
    tree = stream_tree(logp, lambda rows: rows + 10, top_k=2, total_tokens=4)
    # level 1: 10 (0.6), 11 (0.3); level 2 under each: 10 (x0.7), 11 (x0.2). Best four by path
    # probability: 10 (.6), 10>10 (.42), 11 (.3), 11>10 (.21).
    assert tree.tokens == [10, 11, 10, 10]
    assert tree.parents == [-1, -1, 0, 1]
    assert tree.depths == [1, 1, 2, 2]
    assert tree.scores == pytest.approx(torch.tensor([0.6, 0.3, 0.42, 0.21]).log().tolist(), abs=1e-4)
    flat = stream_tree(logp, lambda rows: rows, top_k=1, total_tokens=4)
    assert (flat.tokens, flat.parents, flat.depths) == ([0, 0], [-1, 0], [1, 2])  # top_k 1: a chain


def reference_stream_tree(logp, to_ids, top_k, total):
    """The streams' tree by its definition, in Python lists: stream 1's top_k under the root, stream
    j + 1's under each of the top_k best nodes of level j (ties: the earlier node), the ``total``
    best nodes kept (ties: the earlier node), re-indexed in creation order."""
    top = logp.topk(min(top_k, logp.shape[-1]), dim=-1)
    rows, values = to_ids(top.indices).tolist(), top.values.tolist()
    tokens, parents, depths, scores, level = [], [], [], [], [-1]
    for d, (ids, lps) in enumerate(zip(rows, values), start=1):
        frontier = sorted(level, key=lambda i: (-scores[i] if i >= 0 else 0.0, i))[:len(ids)]
        level = []
        for parent in frontier:
            for token, lp in zip(ids, lps):
                tokens.append(token), parents.append(parent), depths.append(d)
                scores.append((scores[parent] if parent >= 0 else 0.0) + lp)
                level.append(len(tokens) - 1)
    keep = sorted(sorted(range(len(tokens)), key=lambda i: (-scores[i], i))[:total])
    index = {old: new for new, old in enumerate(keep)}
    return ([tokens[i] for i in keep], [index[parents[i]] if parents[i] >= 0 else -1 for i in keep],
            [depths[i] for i in keep], [scores[i] for i in keep])


def test_the_streams_tree_keeps_its_definition():
    """``stream_tree`` (grown by ``stream_fields``, the rule a stage's body runs too) keeps the
    definition's nodes in the same order, ties included, over random streams and settings."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(200):
        gamma, rows, top_k, total = (int(torch.randint(lo, hi, (), generator=gen))
                                     for lo, hi in ((1, 5), (2, 12), (1, 6), (1, 24)))
        scores = torch.randint(0, 3, (gamma, rows), generator=gen).float() if trial % 3 == 0 else \
            torch.randn(gamma, rows, generator=gen)  # every third: ties
        logp = torch.log_softmax(scores, -1)
        tokens, parents, depths, expected_scores = reference_stream_tree(logp, lambda r: r * 2 + 1, top_k, total)
        tree = stream_tree(logp, lambda r: r * 2 + 1, top_k, total)
        assert (tree.tokens, tree.parents, tree.depths) == (tokens, parents, depths), trial
        assert tree.scores == pytest.approx(expected_scores, abs=1e-4)


@pytest.mark.parametrize("one_forward,top_k,total_tokens,lookup",
                         [(0, 1, 4, 0), (0, 3, 8, 0), (0, 2, 4, 6), (1, 1, 4, 0), (1, 3, 8, 0), (1, 2, 4, 6)])
def test_ss_equals_vanilla_on_tiny_prompts(request, one_forward, top_k, total_tokens, lookup):
    ss_pair = request.getfixturevalue("one_forward_pair" if one_forward else "ss_pair")
    gen = torch.Generator().manual_seed(1)
    accepted, off_chain, copied_accepted = 0, 0, 0
    top_layer_runs, stream_runs = [], []
    hook = ss_pair.target.model.layers[-1].register_forward_hook(lambda *_: top_layer_runs.append(1))
    streams = target_streams(ss_pair, one_forward=bool(one_forward))
    stream_hook = streams.merged_layers(ss_pair.target)[-1].register_forward_hook(lambda *_: stream_runs.append(1))
    for _ in range(20):
        prompt = " ".join(f"t{int(t)}" for t in torch.randint(0, 16, (5,), generator=gen))
        vanilla = generate(ss_pair, prompt, method="vanilla", max_new_tokens=24, raw=True)
        top_layer_runs.clear()
        stream_runs.clear()
        ss = generate(ss_pair, prompt, method="ss", max_new_tokens=24, raw=True, gamma=3, top_k=top_k,
                      total_tokens=total_tokens, lookup=lookup, one_forward=one_forward)
        assert ss.token_ids == vanilla.token_ids
        steps = len(ss.trace.steps) - 1  # after the prefill
        # one pass through the target's layers per step, and one of the stream rows through the streams'
        # merged copies of the top layers (with one_forward, those of every window row, in the same step)
        assert len(top_layer_runs) == 1 + steps
        assert len(stream_runs) == steps + one_forward  # with one_forward, the prefill's streams too
        accepted += sum(step.accepted for step in ss.trace.steps)
        trees = [step.tree for step in ss.trace.steps[1:]]
        off_chain += sum(t.path != list(range(len(t.path))) for t in trees)  # kept entries moved in the cache
        copied_accepted += sum(i in t.copied for t in trees for i in t.path)
    hook.remove()
    stream_hook.remove()
    assert accepted > 20  # the streams' drafts were really used, not all rejected
    if top_k > 1:
        assert off_chain > 0  # paths through later siblings were accepted, so KVCache.keep really moved entries
    assert (copied_accepted > 0) == (lookup > 0)  # copied tokens were verified and some accepted


@pytest.mark.parametrize("temperature,top_p,one_forward", [(1.0, 1.0, 0),
                                                          pytest.param(0.7, 0.9, 0, marks=pytest.mark.slow),
                                                          pytest.param(1.0, 1.0, 1, marks=pytest.mark.slow)])
def test_ss_samples_the_target_distribution(request, temperature, top_p, one_forward):
    ss_pair = request.getfixturevalue("one_forward_pair" if one_forward else "ss_pair")
    law = exact_law_of_tokens_2_and_3(ss_pair.target, ss_pair.encode(PROMPT, raw=True), temperature, top_p)
    outputs = []
    counts = sample_counts(ss_pair, "ss", temperature, top_p, outputs=outputs, gamma=2, one_forward=one_forward)
    assert chi_square_p(counts, law) > 1e-3
    assert sum(step.accepted for out in outputs for step in out.trace.steps) > 200  # drafts were accepted


def test_ss_refuses_a_target_without_streams_and_a_gamma_beyond_them(tiny_dirs, ss_pair):
    bare = load_pair(target=str(tiny_dirs["target"]), draft=None)
    with pytest.raises(MirrorSDError, match="needs speculative streams"):
        generate(bare, "t1 t2", method="ss", raw=True)
    with pytest.raises(MirrorSDError, match="gamma must be at most 3"):
        generate(ss_pair, "t1 t2", method="ss", raw=True, gamma=4)
    with pytest.raises(MirrorSDError, match="one_forward=1 needs streams trained without the next-token input"):
        generate(ss_pair, "t1 t2", method="ss", raw=True, one_forward=1)  # these streams see the next token


def test_ss_with_shipped_streams_equals_vanilla_on_the_embedded_target(embedded_pair, equality_prompts,
                                                                      vanilla_reference):
    from conftest import EQUALITY_TOKENS

    settings = [{}, dict(top_k=12, total_tokens=20),  # README: the tau >= 2.5 setting
                dict(one_forward=1, gamma=1, top_k=4, total_tokens=4)]  # the shipped paper streams, one forward
    accepted = [0] * len(settings)
    for i, (prompt, reference) in enumerate(zip(equality_prompts, vanilla_reference)):
        options = settings[i % len(settings)]
        out = generate(embedded_pair, prompt, method="ss", max_new_tokens=EQUALITY_TOKENS, **options)
        assert out.token_ids == reference, (prompt, options)
        accepted[i % len(settings)] += sum(step.accepted for step in out.trace.steps)
    assert min(accepted) > len(equality_prompts) / len(settings)  # both streams' drafts are really accepted
    if embedded_pair.int8_drafting:  # the streams drafted through int8 copies of the top layers only
        layers = embedded_pair.target.model.layers
        first = target_streams(embedded_pair).first_layer
        merged = target_streams(embedded_pair).merged_layers(embedded_pair.target)
        assert hasattr(merged[0].mlp.down_proj.weight, "_int8_packed")
        assert not hasattr(layers[first].mlp.down_proj.weight, "_int8_packed")  # the main rows stay in fp32
