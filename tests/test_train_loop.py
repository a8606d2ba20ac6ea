"""The shared training loop: it lowers the loss, and a run stopped part-way resumes from its
checkpoint to exactly the weights of an uninterrupted run."""
import json

import pytest
import torch

from mirror_sd.train.loop import cosine_schedule, fit


def regression_task(seed: int = 0):
    """A linear model and fixed batches of a linear target (the same every epoch)."""
    gen = torch.Generator().manual_seed(seed)
    truth = torch.randn(4, 3, generator=gen)
    batches = [(x, x @ truth) for x in (torch.randn(16, 4, generator=gen) for _ in range(5))]
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 3, bias=False), batches


def run(model, batches, out, stop_at=None):
    steps = []

    def loss_of(batch):
        if stop_at is not None and len(steps) == stop_at:
            raise KeyboardInterrupt  # the run is killed mid-epoch
        steps.append(1)
        loss = torch.nn.functional.mse_loss(model(batch[0]), batch[1])
        return loss, dict(loss=loss.item(), top1=0.0)

    def evaluate():
        return dict(loss=sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in batches), top1=0.0)

    return fit(model, lambda epoch: batches, loss_of, evaluate, out, epochs=3, lr=0.3, eval_every=4, desc="test")


def test_fit_lowers_the_loss_and_writes_its_files(tmp_path):
    model, batches = regression_task()
    state = run(model, batches, tmp_path)
    held = [h["eval_loss"] for h in state["history"] if "eval_loss" in h]
    assert state["step"] == 15 and held[-1] < 0.5 * held[0]
    assert (tmp_path / "loss.png").stat().st_size > 0 and (tmp_path / "checkpoint" / "state.json").exists()
    assert len(json.loads((tmp_path / "metrics.json").read_text())) == len(state["history"])


def test_a_stopped_run_resumes_to_the_same_weights(tmp_path):
    whole, batches = regression_task()
    run(whole, batches, tmp_path / "whole")
    resumed, _ = regression_task()
    with pytest.raises(KeyboardInterrupt):
        run(resumed, batches, tmp_path / "resumed", stop_at=10)  # last checkpoint: step 8
    restarted, _ = regression_task()  # a fresh process: initial weights, then the checkpoint
    state = run(restarted, batches, tmp_path / "resumed")
    assert state["step"] == 15
    assert torch.allclose(restarted.weight, whole.weight, atol=1e-6)


def test_cosine_schedule_warms_up_then_decays_to_the_floor():
    factor = cosine_schedule(100, warmup=10, floor=0.1)
    assert factor(0) == pytest.approx(0.1) and 0.95 < factor(9) <= 1.0
    assert factor(100) == pytest.approx(0.1) and factor(50) == pytest.approx(0.55)
