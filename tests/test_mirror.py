"""Mirror-SD: equality with vanilla, hits and misses, and real overlap of the two lanes."""
import pytest

from conftest import EQUALITY_TOKENS
from mirror_sd import MirrorSDError, generate
from mirror_sd.devices import cpu_cores


def test_mirror_equals_vanilla_on_varied_prompts(embedded_pair, equality_prompts, vanilla_reference):
    hits = fallbacks = copies = 0
    for i, (prompt, expected) in enumerate(zip(equality_prompts, vanilla_reference)):
        out = generate(embedded_pair, prompt, method="mirror", max_new_tokens=EQUALITY_TOKENS, gamma=3, kappa=4,
                       branch_budget=4, streams=i % 2)  # every other prompt: rollouts from the draft's streams
        assert out.error is None
        assert out.token_ids == expected, f"mirror differs from vanilla on {prompt[:60]!r}"
        hits += sum(s.rendezvous.hit for s in out.trace.steps if s.index > 0)
        copies += sum(s.rendezvous.copied for s in out.trace.steps if s.index > 0)
        fallbacks += out.metrics["fallbacks"]
    assert hits > 0 and fallbacks > 0 and copies > 0  # every path ran: hit, fallback draft, copied window


def test_hit_and_miss_paths(tiny_pair):
    """On a hit the next window is the used branch's continuation with no fresh draft; on a miss
    the next step starts with a fallback draft on the draft lane."""
    out = generate(tiny_pair, "t1 t2 t3", method="mirror", max_new_tokens=40, raw=True, gamma=3, kappa=2,
                   branch_budget=3, lookup=0)
    expected = generate(tiny_pair, "t1 t2 t3", method="vanilla", max_new_tokens=40, raw=True).token_ids
    assert out.token_ids == expected
    steps = [s for s in out.trace.steps if s.index > 0]
    fallback_steps = {s.step for s in out.trace.spans if s.kind == "fallback-draft"}
    seen = set()
    for before, after in zip(steps, steps[1:]):
        if before.rendezvous.hit:
            r, v, continuation = before.rendezvous.branches[before.rendezvous.branch_used]
            assert (r, v) == (before.accepted, before.committed[-1])
            assert after.proposed == continuation and after.index not in fallback_steps
            seen.add("hit")
        else:
            assert after.index in fallback_steps and after.rendezvous.fallback
            seen.add("miss")
    assert seen == {"hit", "miss"}
    m = out.metrics
    assert 0 < m["hit_rate"] < 1 and m["fallbacks"] >= 1 and m["rendezvous_ms"] > 0


def test_a_miss_copies_the_next_window_from_the_context_when_it_can(tiny_pair):
    """With lookup, a miss is followed by a window copied from the context (no fallback draft)
    whenever the context holds a continuation of the last tokens, else by a fallback draft."""
    from app.explain import explain
    from mirror_sd.drafting.lookup import copy_from_context

    prompt = "t1 t2 t3"  # the tiny target soon repeats itself: copies to make; kappa 1 leaves misses to copy after
    out = generate(tiny_pair, prompt, method="mirror", max_new_tokens=40, raw=True, gamma=2, kappa=1,
                   branch_budget=1, lookup=5)
    assert out.token_ids == generate(tiny_pair, prompt, method="vanilla", max_new_tokens=40, raw=True).token_ids
    fallback_steps = {s.step for s in out.trace.spans if s.kind == "fallback-draft"}
    sequence = tiny_pair.encode(prompt, raw=True) + out.trace.steps[0].committed
    steps = [s for s in out.trace.steps if s.index > 0]
    copied_accepted = 0
    for before, after in zip(steps, steps[1:]):
        sequence = sequence + before.committed
        if before.rendezvous.hit:
            continue
        copy = copy_from_context(sequence, 5)
        assert after.rendezvous.copied == bool(copy) and after.rendezvous.fallback == (not copy)
        assert (after.index in fallback_steps) == (not copy)
        if copy:
            assert after.proposed == copy
            assert "copied from the context (no draft work)" in explain(out.trace, after.index, {})  # the app says so
            copied_accepted += after.accepted
    assert copied_accepted > 0


def test_rollout_overlaps_target_suffix_in_time(embedded_pair):
    out = generate(embedded_pair, "Tell me about the moon.", method="mirror", max_new_tokens=16, gamma=3,
                   kappa=4, branch_budget=4)
    spans = out.trace.spans_frame()
    kinds = set(spans.kind)
    assert {"target-prefix", "target-suffix", "draft-rollout", "rendezvous"} <= kinds
    overlapping_steps = 0
    for step, group in spans.groupby("step"):
        suffix = group[group.kind == "target-suffix"]
        rollout = group[group.kind == "draft-rollout"]
        if len(suffix) and len(rollout):
            s, r = suffix.iloc[0], rollout.iloc[0]
            assert s.lane != r.lane
            overlapping_steps += min(s.end, r.end) - max(s.start, r.start) > 0
    assert overlapping_steps >= 1
    assert out.metrics["overlap"] > 0
    threads = out.trace.meta["threads"]  # the two CPU lanes split the cores between them
    assert len(threads) == 2 and sum(threads.values()) <= max(2, cpu_cores())


def test_exit_layer_must_be_inside_the_target(tiny_pair):
    with pytest.raises(MirrorSDError, match="exit_layer must be below the target's 2 layers"):
        generate(tiny_pair, "t1", method="mirror", raw=True, exit_layer=2)


def test_early_exit_scores_only_a_reduced_drafts_tokens(tiny_dirs):
    """With a reduced-vocabulary draft the early exit computes the head rows of the draft's tokens
    only: their log-probs renormalised over those rows, -inf elsewhere; mirror stays lossless."""
    import torch

    from mirror_sd import load_pair
    from mirror_sd.methods.mirror import early_exit

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["reduced_draft"]))
    rows = pair.draft.vocab_map
    hidden = torch.randn(1, 3, pair.target.args.hidden_size)
    with torch.inference_mode():
        logp = early_exit(pair, hidden)  # [3, 16]
        full = pair.target.head(hidden)[0]  # [3, 16]
    assert logp.shape == full.shape
    torch.testing.assert_close(logp[:, rows], torch.log_softmax(full[:, rows], dim=-1), atol=1e-5, rtol=1e-5)
    others = torch.ones(16, dtype=torch.bool)
    others[rows] = False
    assert torch.isneginf(logp[:, others]).all()
    for prompt in ["t1 t2 t3", "t4 t4 t4 t4"]:
        expected = generate(pair, prompt, method="vanilla", max_new_tokens=24, raw=True).token_ids
        out = generate(pair, prompt, method="mirror", max_new_tokens=24, raw=True, gamma=2, kappa=2, branch_budget=4)
        assert out.token_ids == expected
        assert all(v in rows.tolist() for s in out.trace.steps[1:] for c in s.rendezvous.exit_candidates for v in c)


def test_branches_are_chosen_by_the_chance_the_step_ends_there():
    """Hand computation: window d1 = 5, d2 = 6; early-exit top-2 per position r = 0, 1, 2.
    P(step ends at (r, v)) = P(d1..dr accepted) * P(v at r): (0, 7) 0.30, (1, 8) 0.6 * 0.45 = 0.27,
    (2, 9) 0.6 * 0.4 * 0.7 = 0.168, (2, 10) 0.048; (0, 5) and (1, 6) are acceptances, not branches."""
    import math

    import torch

    from conftest import valid_branches

    top_ids = torch.tensor([[5, 7], [8, 6], [9, 10]])
    top_logp = torch.tensor([[0.6, 0.3], [0.45, 0.4], [0.7, 0.2]]).log()
    window_logp = torch.tensor([0.6, 0.4]).log()  # the exit's log-prob of d1 at 0 and of d2 at 1
    branches = valid_branches([5, 6], top_ids, top_logp, window_logp, budget=10)
    assert [(b.accepted, b.root) for b in branches] == [(0, 7), (1, 8), (2, 9), (2, 10)]
    assert [math.exp(b.score) for b in branches] == pytest.approx([0.30, 0.27, 0.168, 0.048])
    # a budget of 2 keeps the likeliest step ends, not the likeliest candidates ((2, 9) at 0.7, (1, 8) at 0.45)
    assert [(b.accepted, b.root) for b in valid_branches([5, 6], top_ids, top_logp, window_logp, 2)] == [(0, 7), (1, 8)]


def test_the_branch_rule_keeps_its_definition():
    """mirror_sd/branches.py's tensor rule (the step on either executor and the rollout stage both
    run it) gives the definition's valid branches, scores and order (ties included), then the skipped
    candidates, marked invalid, up to min(budget, T * kappa) rows: even after a window token the exit
    gave -inf (a copied token outside the draft's vocabulary)."""
    import torch

    from conftest import reference_branches
    from mirror_sd.branches import choose_branches

    gen = torch.Generator().manual_seed(0)
    for trial in range(40):
        T, kappa = 1 + trial % 6, 1 + trial % 4
        draft = torch.randint(0, 12, (T - 1,), generator=gen).tolist()
        top_ids = torch.stack([torch.randperm(12, generator=gen)[:kappa] for _ in range(T)])
        top_logp = torch.randn(T, kappa, generator=gen).sort(dim=-1, descending=True).values
        top_logp[:, -1] = top_logp[:, 0] if trial % 3 == 0 else top_logp[:, -1]  # ties
        window_logp = torch.randn(T - 1, generator=gen)
        if trial % 5 == 0 and T > 2:
            window_logp[0] = float("-inf")
        for budget in (1, 3, 64):
            expected = reference_branches(draft, top_ids, top_logp, window_logp, budget)
            r, roots, scores, valid = choose_branches(draft, top_ids, top_logp, window_logp, budget)
            assert len(r) == min(budget, T * kappa) and valid.sum() == len(expected) and not valid[len(expected):].any()
            assert expected == list(zip(r.tolist(), roots.tolist(), scores.tolist()))[:len(expected)]


@pytest.mark.parametrize("options", [dict(lookup=0), dict(lookup=8, gamma=2)])
def test_a_queued_step_commits_and_records_what_the_hosts_does(tiny_pair, monkeypatch, options):
    """Queued steps (``queue_steps`` "on") queue each step's phases on the lanes' streams
    (``executors.Streams``; on a GPU: the host waits once, at the rendezvous; here, on the CPU, the same
    work in turn on one thread): vanilla's tokens, and every step's early-exit candidates, branches and
    hit as the lanes' threads ("off") record them."""
    expected = generate(tiny_pair, "t1 t2 t3", method="vanilla", max_new_tokens=40, raw=True).token_ids
    runs = {}
    for queued in ("off", "on"):
        monkeypatch.setattr(tiny_pair, "queue_steps", queued)
        out = generate(tiny_pair, "t1 t2 t3", method="mirror", max_new_tokens=40, raw=True, **{"gamma": 3, "kappa": 2,
                       "branch_budget": 3, **options})
        assert out.error is None and out.token_ids == expected
        runs[queued] = [s.rendezvous for s in out.trace.steps[1:]]
        kinds = {s.kind for s in out.trace.spans}
        assert {"target-prefix", "target-suffix", "draft-rollout", "rendezvous"} <= kinds
    assert runs["off"] == runs["on"] and any(r.hit for r in runs["on"])


@pytest.mark.parametrize("tree", [0, 3])
def test_a_queued_step_queues_its_verification_before_its_one_wait(tiny_pair, monkeypatch, tree):
    """A queued step (chain or tree window) queues the target's picks after the suffix, then waits:
    after the step's first wait for its target or rollout work, it queues nothing more (on a GPU, the
    host would otherwise wait twice a step, the GPU idling meanwhile)."""
    from mirror_sd.devices import Lane, Queued

    log = []
    queue, record = Lane.queue, Queued.record

    def logged_queue(self, kind, fn, *args, **kwargs):
        log.append(("queue", kind, kwargs.get("step")))
        return queue(self, kind, fn, *args, **kwargs)

    def logged_record(self):
        log.append(("wait", self.kind, self.step))
        return record(self)

    monkeypatch.setattr(Lane, "queue", logged_queue)
    monkeypatch.setattr(Queued, "record", logged_record)
    monkeypatch.setattr(tiny_pair, "queue_steps", "on")
    out = generate(tiny_pair, "t1 t2 t3", method="mirror", max_new_tokens=24, raw=True, gamma=2, kappa=2,
                   branch_budget=3, lookup=0, tree=tree)
    assert out.error is None
    steps = {step for _, kind, step in log if kind == "rendezvous"}
    assert len(steps) == len(out.trace.steps) - 1  # every step after the prefill's
    for step in steps:
        events = [(what, kind) for what, kind, s in log if s == step and kind != "fallback-draft"]
        first_wait = events.index(next(e for e in events if e[0] == "wait"))
        assert ("queue", "rendezvous") in events[:first_wait]
        assert all(what == "wait" for what, _ in events[first_wait:])


def test_queued_steps_need_temperature_0_and_token_by_token_rollouts(tiny_pair, monkeypatch):
    from types import SimpleNamespace

    from mirror_sd.methods.mirror import Settings, make_context

    def queued(greedy, streams=0, setting="on"):
        monkeypatch.setattr(tiny_pair, "queue_steps", setting)
        run = SimpleNamespace(pair=tiny_pair, draft_sampler=SimpleNamespace(greedy=greedy))
        return make_context(run, Settings(2, 2, 1, 4, streams=streams)).ex.queued

    assert queued(True)
    assert not queued(True, setting="auto")  # CUDA lanes only; these are the CPU's
    assert not queued(False) and not queued(True, streams=1)
