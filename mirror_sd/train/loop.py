"""The training loop every trainer here shares (draft, EAGLE head, speculative streams).

AdamW with a linear warm-up and a cosine decay to a tenth of the learning rate, gradient clipping,
a tqdm bar, held-out evaluation every ``eval_every`` steps, a resumable checkpoint (safetensors +
JSON, no pickle) and the loss-curve PNG written at each evaluation. A trainer supplies its batches
per epoch, the loss of one batch and its held-out evaluation.
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm


def cosine_schedule(total_steps: int, warmup: int = 20, floor: float = 0.1) -> Callable[[int], float]:
    """Learning-rate factor at a step: linear warm-up, then cosine from 1 down to ``floor``."""
    def factor(step: int) -> float:
        progress = min(step, total_steps) / total_steps
        return min(1.0, (step + 1) / warmup) * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress)))
    return factor


def fit(model: torch.nn.Module, epoch_batches: Callable[[int], list], loss_of: Callable, evaluate: Callable[[], dict],
        out: Path, epochs: float, lr: float, eval_every: int, desc: str) -> dict:
    """Train ``model``'s trainable parameters; resumes from out/checkpoint if it exists.

    epoch_batches(epoch) -> the batches of that epoch (same length every epoch);
    loss_of(batch) -> (objective to minimise, {name: float} to log; "loss" and "top1" shown);
    evaluate() -> held-out {name: float}, at least "loss" and "top1".
    Returns the state: step, history (train and held-out rows), wall_s.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    steps_per_epoch = len(epoch_batches(0))
    total_steps = max(1, int(steps_per_epoch * epochs))
    schedule = cosine_schedule(total_steps)
    ckpt = out / "checkpoint"
    state = dict(step=0, history=[], wall_s=0.0)
    if (ckpt / "state.json").exists():
        state = load_checkpoint(ckpt, model, optimizer)
        print(f"resumed at step {state['step']}")
    model.train()
    start = time.time() - state["wall_s"]
    bar = tqdm(total=total_steps, initial=state["step"], desc=desc, unit="step")
    while state["step"] < total_steps:
        epoch, done = divmod(state["step"], steps_per_epoch)
        for batch in epoch_batches(epoch)[done:]:  # resuming: skip the batches already seen
            for group in optimizer.param_groups:
                group["lr"] = lr * schedule(state["step"])
            objective, logs = loss_of(batch)
            optimizer.zero_grad(set_to_none=True)
            objective.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            state["step"] += 1
            state["history"].append(dict(step=state["step"], **{f"train_{k}": v for k, v in logs.items()}))
            bar.update()
            bar.set_postfix(loss=f"{logs['loss']:.3f}", top1=f"{logs['top1']:.3f}")
            if state["step"] % eval_every == 0 or state["step"] == total_steps:
                held_out = run_evaluation(model, evaluate)
                state["history"].append(dict(step=state["step"], **{f"eval_{k}": v for k, v in held_out.items()}))
                tqdm.write(f"step {state['step']}: held-out " + ", ".join(f"{k} {_fmt(v)}" for k, v in held_out.items()))
                state["wall_s"] = time.time() - start
                save_checkpoint(ckpt, model, optimizer, state)
                plot_losses(state["history"], out / "loss.png")
            if state["step"] >= total_steps:
                break
    bar.close()
    state["wall_s"] = time.time() - start
    (out / "metrics.json").write_text(json.dumps(state["history"]))
    plot_losses(state["history"], out / "loss.png")
    return state


def run_evaluation(model: torch.nn.Module, evaluate: Callable[[], dict]) -> dict:
    """evaluate() in eval mode and without gradients, then back to training mode."""
    model.eval()
    with torch.no_grad():
        result = evaluate()
    model.train()
    return result


def _fmt(value) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def save_checkpoint(folder: Path, model: torch.nn.Module, optimizer, state: dict):
    """Trainable weights and optimizer moments in safetensors, the step and history in JSON."""
    folder.mkdir(parents=True, exist_ok=True)
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    tensors = {f"model.{k}": v for k, v in model.state_dict().items() if k in trainable}
    for i, st in optimizer.state_dict()["state"].items():
        for k, v in st.items():
            tensors[f"optim.{i}.{k}"] = v if torch.is_tensor(v) else torch.tensor(v)
    save_file({k: v.contiguous().cpu() for k, v in tensors.items()}, str(folder / "state.safetensors"))
    (folder / "state.json").write_text(json.dumps(state))


def load_checkpoint(folder: Path, model: torch.nn.Module, optimizer) -> dict:
    tensors = load_file(str(folder / "state.safetensors"))
    model.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("model.")}, strict=False)
    opt_state = optimizer.state_dict()
    for i in opt_state["param_groups"][0]["params"]:
        keys = [k for k in tensors if k.startswith(f"optim.{i}.")]
        if keys:
            opt_state["state"][i] = {k.split(".", 2)[2]: tensors[k] for k in keys}
    optimizer.load_state_dict(opt_state)
    return json.loads((folder / "state.json").read_text())


def plot_losses(history: list[dict], path: Path):
    """Train and held-out loss against steps, held-out top-1 on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    train = [h for h in history if "train_loss" in h]
    held = [h for h in history if "eval_loss" in h]
    ax.plot([h["step"] for h in train], [h["train_loss"] for h in train], label="train loss", alpha=0.6)
    ax.plot([h["step"] for h in held], [h["eval_loss"] for h in held], "o-", label="held-out loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax2 = ax.twinx()
    ax2.plot([h["step"] for h in held], [h["eval_top1"] for h in held], "s--", color="green", label="held-out top-1")
    ax2.set_ylabel("top-1 agreement with the target")
    fig.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
