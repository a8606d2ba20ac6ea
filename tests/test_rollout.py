"""Mirror-SD's queued draft-lane work as one stage (models/rollout.py): the branches and rollouts that
the branch rule (mirror_sd/branches.py) and ``roll_out_chains`` give, from one replay; what it refuses; and a
queued step on stages leaves the host far fewer operations."""
from types import SimpleNamespace

import pytest
import torch

from mirror_sd import generate, load_pair
from mirror_sd.branches import choose_branches
from mirror_sd.methods.mirror_rollouts import roll_out_chains
from mirror_sd.models.channel import Channel
from mirror_sd.models.forwards import FULL, forward, stage_cache
from mirror_sd.models.rollout import Rollouts
from mirror_sd.models.stages import Stage
from mirror_sd.sampling import draft_argmax
from mirror_sd.train.ss import greedy_continuations


@pytest.fixture(scope="module")
def pair(tiny_dirs):
    """The tiny pair, drafting in fp32: its draft's forwards here are compared with one replay's, and
    int8 products quantise a product's rows together, so padding rows would move them."""
    return load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), target_device="cpu",
                     draft_device="cpu", int8_drafting=False)


def channel(T: int, kappa: int, window: list[int], seed: int):
    """A token channel over T rows: distinct candidates per row (some of them the window's own next
    token, which is an acceptance, not a branch), their log-probs best first (ties included), and
    the window tokens' log-probs."""
    g = torch.Generator().manual_seed(seed)
    top_ids = torch.stack([torch.randperm(16, generator=g)[:kappa] for _ in range(T)])
    for r, token in enumerate(window):
        if r % 2 == 0:
            top_ids[r, -1] = token if token not in top_ids[r, :-1] else top_ids[r, -1]
    top_logp = torch.randn(T, kappa, generator=g).sort(dim=-1, descending=True).values
    top_logp[:, -1] = top_logp[:, 0] if seed % 2 else top_logp[:, -1]
    return top_ids, top_logp, torch.randn(T - 1, generator=g)


@pytest.mark.parametrize("T,kappa,budget,gamma,unseen", [(3, 4, 16, 2, 1), (3, 2, 16, 3, 2), (5, 4, 6, 2, 1),
                                                         (1, 3, 4, 1, 1), (9, 4, 16, 2, 3)])
def test_one_replay_rolls_out_the_branches_the_device_chooses(pair, T, kappa, budget, gamma, unseen):
    """After a prompt the draft has seen but its last ``unseen`` tokens: the stage's valid branches
    (order, scores) and their tokens are those of the branch rule (mirror_sd/branches.py) and ``roll_out_chains``
    on the plain forward, and every row past them is marked invalid; the chain's keys and values
    match, and where both roll out as many branches, every root's and rolled-out token's (the same
    rows, positions and views, written at the same slots)."""
    draft, V = pair.draft, pair.target.args.vocab_size
    rows = max(T, 3)
    spec = Rollouts(min(budget, rows * kappa), gamma, kappa, rows, V)
    sequence = [1, 5, 2, 9, 4, 7, 3][:4 + unseen]
    window = [6, 11, 2, 8, 12, 1, 3, 9][:T - 1]
    top_ids, top_logp, window_logp = channel(T, kappa, window, seed=T + kappa + budget)
    plain, staged = draft.new_cache(200), stage_cache({}, draft, 200, [FULL, spec])
    for cache in (plain, staged):
        forward(draft, torch.tensor([sequence[:4]]), cache)
    run = SimpleNamespace(pair=pair, sequence=sequence, draft_sampler=SimpleNamespace(greedy=True),
                          draft_picks=lambda logits: draft_argmax(logits, draft.vocab_map, V))
    r, roots, scores, valid = choose_branches(window, top_ids, top_logp, window_logp, budget)
    picks, _ = roll_out_chains(run, plain, window, r, roots, gamma)
    table = staged.stages.run(spec.name, [sequence[4:] + window], rows=unseen + len(window) + spec.budget,
                              channel=Channel.of(top_ids, top_logp, window_logp)).table
    expected = [(int(a), int(b), float(s), p) for a, b, s, p, ok in
                zip(r, roots, scores.tolist(), picks.tolist(), valid) if ok]
    got = [(int(row[0]), int(row[1]), row[3], [int(t) for t in row[4:]]) for row in table.tolist() if row[2]]
    assert got == expected and len(got) > 0
    assert not table[len(expected):, 2].any()
    C = unseen + len(window)
    used = 4 + C + (gamma * spec.budget if spec.budget == len(r) else 0)  # where both roll out as many branches:
    assert torch.allclose(staged.k[:, :, :, :used], plain.k[:, :, :, :used], atol=1e-5)  # every root and token
    assert torch.allclose(staged.v[:, :, :, :used], plain.v[:, :, :, :used], atol=1e-5)  # at the same slot


def test_a_stage_refuses_what_it_cannot_hold(pair):
    spec = Rollouts(8, 2, 4, 3, pair.target.args.vocab_size)
    cache = stage_cache({}, pair.draft, 100, [spec])
    assert cache.stages.missing([spec.name]) == []  # made at its widths only: those that hold a chain and 8 roots
    stage = cache.stages.stage(spec.name, 16)
    ids, logp = torch.zeros(4, 4, dtype=torch.long), torch.zeros(4, 4)
    with pytest.raises(Exception, match="1 to 3 channel rows"):
        stage.run([[1, 2, 3]], channel=Channel.of(ids, logp, torch.zeros(3)))


def test_a_queued_step_on_stages_commits_vanillas_tokens_with_far_fewer_host_operations(tiny_dirs, pair, monkeypatch):
    """mirror_sd/tools/host_ops.py: a queued Mirror-SD step on stages (the token channel and the draft's work one
    replay each) commits vanilla's tokens and runs under half the host operations of one whose channel
    and rollouts run a forward at a time."""
    from mirror_sd.tools.host_ops import count_ops, replay_outside_the_count

    monkeypatch.setattr(Stage, "replay", replay_outside_the_count(Stage.replay))
    staged = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    staged.queue_steps = "on"
    expected = generate(pair, "t1 t2 t3", method="vanilla", max_new_tokens=16, raw=True).token_ids
    out = generate(staged, "t1 t2 t3", method="mirror", max_new_tokens=16, raw=True)
    assert out.token_ids == expected and "note" not in out.trace.meta  # no lane failed
    assert any(step.rendezvous.branch_used is not None for step in out.trace.steps[1:])  # the rollouts hit
    one_replay = count_ops(staged, "mirror", 16, prompt="t1 t2 t3", raw=True)
    for module in ("mirror", "mirror_rollouts"):  # the channel and the rollouts: a forward at a time
        monkeypatch.setattr(f"mirror_sd.methods.{module}.staged_for", lambda *a: None)
    forward_by_forward = count_ops(staged, "mirror", 16, prompt="t1 t2 t3", raw=True)
    assert 2 * one_replay["ops_per_step"] < forward_by_forward["ops_per_step"]


@pytest.mark.parametrize("options", [dict(branch_budget=64, kappa=16), dict(branch_budget=40, kappa=16, lookup=0)])
def test_wide_budgets_roll_out_on_the_widest_stage_or_a_forward_at_a_time(tiny_dirs, pair, options):
    """Wide budgets: 40 roots still fit the widest stage (64 rows) beside the chain; 64 do not, and
    those steps roll out a forward at a time, on stages still. Both commit vanilla's tokens."""
    staged = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    staged.queue_steps = "on"
    expected = generate(pair, "t1 t2 t3", method="vanilla", max_new_tokens=12, raw=True).token_ids
    out = generate(staged, "t1 t2 t3", method="mirror", max_new_tokens=12, raw=True, **options)
    assert out.error is None and out.token_ids == expected and "note" not in out.trace.meta


@pytest.mark.parametrize("prompt", ["t1 t2 t3", "t5 t9 t2 t7 t7"])
def test_a_miss_takes_its_next_window_from_the_correction_rollout(tiny_dirs, pair, prompt):
    """In a queued step on stages the draft stream rolls out the branch of the target's own outcome
    after its picks (``roll_out_correction``): the step after a miss takes that branch as its window,
    with no fallback draft after the first step, and the window is the draft's greedy continuation
    of the committed tokens, as a fallback draft's would be; the correction's spans are on the draft
    lane, one per step. On the lanes' threads (``queue_steps`` "off") no correction runs (the
    executor's ``aside``): a miss drafts afresh. Vanilla's tokens either way."""
    staged = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    expected = generate(pair, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
    runs = {}
    for queued in (0, 1):
        staged.queue_steps = ("off", "on")[queued]
        runs[queued] = generate(staged, prompt, method="mirror", max_new_tokens=24, raw=True, lookup=0, gamma=3,
                                kappa=2, branch_budget=2)
    for out in runs.values():
        assert out.error is None and out.token_ids == expected and "note" not in out.trace.meta
    steps = runs[1].trace.steps
    corrected = [s.rendezvous.corrected for s in steps[1:]]
    assert corrected[1:] == [not s.rendezvous.hit for s in steps[1:-1]] and any(corrected)
    assert [s.rendezvous.fallback for s in steps[1:]] == [True] + [False] * (len(steps) - 2)
    sequence = pair.encode(prompt, raw=True)
    for step in steps:
        if step.rendezvous is not None and step.rendezvous.corrected:
            assert step.proposed == greedy_continuations(pair.draft, sequence, [len(sequence) - 1], 3)[0]
        sequence += step.committed
    spans = [s for s in runs[1].trace.spans if s.kind == "correction-rollout"]
    assert sorted(s.step for s in spans) == [s.index for s in steps[1:]]
    assert {runs[1].trace.lanes[s.lane] for s in spans} == {"draft"}
    assert not any(s.kind == "correction-rollout" for s in runs[0].trace.spans)
    assert not any(s.rendezvous.corrected for s in runs[0].trace.steps[1:])
    assert any(s.rendezvous.fallback for s in runs[0].trace.steps[2:])
