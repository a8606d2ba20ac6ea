"""Mirror-SD's trained early-exit head: the logit lens when untrained, target ids out, training
raises held-out recall, and mirror with it stays lossless (T = 0 and a chi-square test at T > 0)."""
import json

import pytest
import torch

from conftest import EQUALITY_TOKENS
from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.methods.mirror import early_exit
from mirror_sd.models.exit_head import (EMBEDDED_EXIT_HEAD, ExitHead, SwiGLUExitHead, attach_exit_head,
                                        available_exit_head, load_exit_head, new_exit_head, save_exit_head)
from test_distribution import PROMPT, chi_square_p, exact_law_of_tokens_2_and_3, sample_counts
from test_train_draft import _distilled_data

SHIPPED = (EMBEDDED_EXIT_HEAD / "model.safetensors").exists()


def random_head(target, scale: float = 0.5, mlp: int = 0) -> ExitHead:
    """A head at the tiny target's exit layer (1 of 2) with random weights: unlike the logit lens
    (low rank 8, or SwiGLU with ``mlp`` hidden units)."""
    torch.manual_seed(4)
    head = new_exit_head(target, 1, rank=8, mlp=mlp)
    with torch.no_grad():
        torch.nn.init.normal_((head.down if mlp else head.up).weight, std=scale)  # the zero-started projection
    return head.eval()


@pytest.fixture(scope="module")
def trained_head(tiny_dirs, tiny_pair, tmp_path_factory):
    """A head trained briefly for the tiny target over its whole vocabulary: (folder, card)."""
    from mirror_sd.train.exit_head import train

    root = tmp_path_factory.mktemp("exit-head")
    data = _distilled_data(tiny_pair, root / "data")
    card = train(data, root / "head", features=root / "features", rank=8, draft=None, epochs=40, lr=1e-2,
                 batch_tokens=128, eval_every=40, holdout=0.2, threads=1, target_dir=tiny_dirs["target"])
    return root / "head", card


@pytest.mark.parametrize("mlp", [0, 24])
def test_an_untrained_head_is_exactly_the_logit_lens(tiny_dirs, mlp):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    head = new_exit_head(pair.target, 1, mlp=mlp)
    hidden = 5 * torch.randn(1, 4, pair.target.args.hidden_size)
    with torch.inference_mode():
        assert torch.equal(head(hidden), hidden)
        assert torch.equal(early_exit(pair, head(hidden)), early_exit(pair, hidden))


@pytest.mark.parametrize("mlp", [0, 24])  # low rank, SwiGLU
def test_the_head_saves_loads_and_scores_target_ids_over_the_drafts_rows(tiny_dirs, tmp_path, mlp):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    head = random_head(pair.target, mlp=mlp)
    save_exit_head(head, tmp_path / "head", pair.target, "tiny", dict(target="tiny"))
    loaded = load_exit_head(tmp_path / "head", pair.target)
    config = json.loads((tmp_path / "head" / "config.json").read_text())
    assert loaded.exit_layer == 1 and config["exit_layer"] == 1
    assert isinstance(loaded, SwiGLUExitHead) == bool(mlp) and loaded.size == head.size
    assert config.get("mlp", 0) == mlp and config["architecture"] == head.architecture
    rows = pair.draft.vocab_map
    hidden = 3 * torch.randn(1, 5, pair.target.args.hidden_size)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(hidden), head(hidden))
        logp = early_exit(pair, loaded(hidden))  # [5, 16]: target ids, as the logit lens's
        expected = torch.log_softmax(pair.target.head(loaded(hidden))[0, :, rows], dim=-1)
        lens = early_exit(pair, hidden)
    torch.testing.assert_close(logp[:, rows], expected, atol=1e-5, rtol=1e-5)
    others = torch.ones(16, dtype=torch.bool)
    others[rows] = False
    assert torch.isneginf(logp[:, others]).all()
    assert not torch.equal(logp.argmax(-1), lens.argmax(-1))  # the head changes the candidates

    other = load_pair(target=str(tiny_dirs["draft"]), draft=None)  # another target of the same shape
    with pytest.raises(MirrorSDError, match="was trained for another target"):
        load_exit_head(tmp_path / "head", other.target)
    with pytest.raises(MirrorSDError, match="no early-exit head in"):
        load_exit_head(tmp_path, pair.target)


def test_short_training_lowers_the_loss_and_raises_held_out_recall(trained_head):
    folder, card = trained_head
    head, lens = card["held_out"], card["held_out_lens"]
    assert head["loss"] < 0.7 * lens["loss"]
    assert head["top1"] > lens["top1"] and head["top2"] > lens["top2"] and head["top16"] == 1.0  # vocabulary 16
    history = json.loads((folder / "metrics.json").read_text())
    train_loss = [h["train_loss"] for h in history if "train_loss" in h]
    assert sum(train_loss[-5:]) < 0.7 * sum(train_loss[:5])
    readme = (folder / "README.md").read_text()
    assert "| answer" in readme and "logit lens" in readme and (folder / "loss.png").stat().st_size > 0


def test_mirror_with_the_trained_head_commits_vanillas_tokens(tiny_dirs, trained_head):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    head = load_exit_head(trained_head[0], pair.target)
    changed = 0
    for prompt in ["t1 t2 t3", "t4 t4 t4 t4", "t15 t0 t7", "t9 t3"]:
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=32, raw=True).token_ids
        for gamma, kappa, budget in [(2, 2, 3), (3, 1, 1), (4, 4, 8)]:
            options = dict(max_new_tokens=32, raw=True, gamma=gamma, kappa=kappa, branch_budget=budget, lookup=0)
            attach_exit_head(pair, head)
            out = generate(pair, prompt, method="mirror", **options)
            assert out.error is None and out.token_ids == expected
            pair.exit_heads.clear()  # no head: the logit lens
            lens = generate(pair, prompt, method="mirror", **options)
            changed += [s.rendezvous.exit_candidates for s in out.trace.steps[1:]] != \
                [s.rendezvous.exit_candidates for s in lens.trace.steps[1:]]
    assert changed > 0  # the head, not the lens, chose the branches


@pytest.mark.slow
def test_mirror_with_the_trained_head_samples_the_target_distribution(tiny_dirs, trained_head):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    attach_exit_head(pair, load_exit_head(trained_head[0], pair.target))
    outputs = []
    counts = sample_counts(pair, "mirror", 1.0, 1.0, outputs=outputs, gamma=2, kappa=2, branch_budget=3)
    assert sum(s.rendezvous.hit for out in outputs for s in out.trace.steps[1:]) > 100  # windows from branches
    law = exact_law_of_tokens_2_and_3(pair.target, pair.encode(PROMPT, raw=True), 1.0, 1.0)
    assert chi_square_p(counts, law) > 1e-3


def test_a_head_is_read_at_its_own_exit_layer_only(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    assert available_exit_head(pair, 1) is None  # none shipped for this target: the logit lens
    attach_exit_head(pair, random_head(pair.target))
    assert available_exit_head(pair, 1) is pair.exit_heads[1] and available_exit_head(pair, 2) is None
    with pytest.raises(MirrorSDError, match="exit layer must be in 1..1"):
        new_exit_head(pair.target, 2)


@pytest.mark.skipif(not SHIPPED, reason="the trained head is not shipped yet")
def test_the_shipped_head_is_for_exit_layer_22_and_stays_lossless(embedded_pair, equality_prompts, vanilla_reference):
    for prompt, expected in list(zip(equality_prompts, vanilla_reference))[::4]:
        out = generate(embedded_pair, prompt, method="mirror", max_new_tokens=EQUALITY_TOKENS)
        assert out.error is None and out.token_ids == expected, f"mirror with its head differs on {prompt[:60]!r}"
        assert all("trained early exit" in s.label for s in out.trace.spans if s.kind == "target-prefix")


@pytest.mark.skipif(not SHIPPED, reason="the trained head is not shipped yet")
def test_the_embedded_target_reads_each_shipped_exit_layer_with_its_own_head(embedded_pair, equality_prompts,
                                                                              vanilla_reference):
    from mirror_sd.models.exit_head import embedded_exit_heads

    shipped = embedded_exit_heads()
    assert {14, 22} <= set(shipped)
    assert all(available_exit_head(embedded_pair, layer).exit_layer == layer for layer in shipped)
    assert available_exit_head(embedded_pair, 20) is None  # no head there: the logit lens
    out = generate(embedded_pair, equality_prompts[1], method="mirror", max_new_tokens=EQUALITY_TOKENS, exit_layer=14)
    assert out.error is None and out.token_ids == vanilla_reference[1]
    assert all("trained early exit" in s.label for s in out.trace.spans if s.kind == "target-prefix")


def test_the_trainer_is_a_subcommand():
    from mirror_sd.train.__main__ import build_parser

    args = build_parser().parse_args(["exit-head", "--data", "d", "--out", "o"])
    assert (args.exit_layer, args.rank, args.mlp, args.draft, args.batch_tokens) == (0, 64, 0, "default", 1024)


def test_by_default_mirror_uses_a_trained_head_where_there_is_one(tiny_dirs, trained_head):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    options = dict(max_new_tokens=16, raw=True, gamma=2, kappa=2, branch_budget=3, lookup=0)

    def candidates():
        out = generate(pair, "t1 t2 t3", method="mirror", **options)
        assert out.error is None
        labels = {s.label for s in out.trace.spans if s.kind == "target-prefix"}
        return [s.rendezvous.exit_candidates for s in out.trace.steps[1:]], labels

    lens, lens_labels = candidates()  # no head for this target: the logit lens
    assert not any("trained" in label for label in lens_labels)
    attach_exit_head(pair, load_exit_head(trained_head[0], pair.target))
    head, head_labels = candidates()
    assert head != lens and all("trained early exit" in label for label in head_labels)
