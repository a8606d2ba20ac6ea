"""Train Mirror-SD's early-exit head (``python -m mirror_sd.train exit-head ...``): low rank or SwiGLU.

Data: the target's features over the distilled examples, computed once and cached by
``train/features.py`` (the cache the EAGLE trainer uses), with early features at the exit layer:
per token, the hidden state h after ``exit_layer`` target layers through layer exit_layer's input
norm, and the final feature f (what the LM head reads). That early feature divided by the norm's
weight is h / rms(h), all the head and the final norm need (``models/exit_head.py``).

Loss: KL(target's final distribution || the exit's), both over the LM-head rows of the draft's
vocabulary (what Mirror-SD's early exit scores: ``methods/mirror.py: early_exit``), at every
position, prompts included. The head has no attention, so positions are independent and a batch is
``--batch-tokens`` positions drawn at random from all the training examples.

Held-out evaluation (whole examples held out by a seeded shuffle): top-kappa recall, the share of
positions whose target argmax (the full head's: the token greedy verification emits, and so the
token a branch must guess) is among the exit's top-kappa, kappa in 1, 2, 4, 8, 16. Over the
positions that predict answer tokens (what decoding meets) and the hard ones among them (the
target's final top-1 probability below 0.5: where drafts get rejected), beside the untrained
logit lens.

Outputs in --out: model.safetensors (fp32), config.json (the target and exit layer), training.json
(the card's numbers), README.md (the model card), loss.png, metrics.json, checkpoint/ (resumable).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..devices import hardware_name, resolve_device
from ..errors import MirrorSDError
from ..methods.mirror import default_exit_layer
from ..models.exit_head import ExitHead, new_exit_head, save_exit_head
from ..models.loading import VOCAB_MAP_KEY, embedded_model_dir, load_model, load_state_dict, model_name
from ..models.pair import EMBEDDED_DRAFT
from .card import ModelCard, trained_on
from .data import IGNORE, data_folders, data_source, read_examples
from .eagle import data_line, example_sequences, rows_of, split_order
from .features import features_dir
from .loop import fit, run_evaluation
from .options import Defaults, TrainerOptions, non_negative_int, positive_float, positive_int, train_kwargs

KAPPAS = (1, 2, 4, 8, 16)
HARD = 0.5  # a position is hard when the target's final top-1 probability is below this


def draft_rows(draft: Path | None, target) -> torch.Tensor:
    """Target ids of the rows the early exit scores: the draft's vocab_map, or every id (no draft,
    or a draft with the full vocabulary)."""
    vocab_map = load_state_dict(Path(draft), torch.device("cpu")).get(VOCAB_MAP_KEY) if draft else None
    return vocab_map.long() if vocab_map is not None else torch.arange(target.args.vocab_size)


def position_table(seqs: list[dict], exit_norm: torch.Tensor, row_of: torch.Tensor) -> dict:
    """Every position of ``seqs`` in one table: x [N, d] (h / rms(h) after the exit layer, fp16),
    feats [N, d] (final features, fp16), label [N] (the head row of the target's argmax, IGNORE
    outside the rows) and answer [N] (the position predicts an answer token)."""
    if (exit_norm == 0).any():
        raise MirrorSDError("the exit layer's input norm has zero weights: h / rms(h) cannot be recovered from "
                            "its early features")
    x = torch.cat([(s["early"].float() / exit_norm).half() for s in seqs])
    answer = torch.cat([torch.arange(len(s["ids"])) >= s.get("answer_start", 0) - 1 for s in seqs])
    return dict(x=x, feats=torch.cat([s["feats"] for s in seqs]), label=row_of[torch.cat([s["argmax"] for s in seqs])],
                answer=answer)


class Exit(torch.nn.Module):
    """The early exit as a whole: the head (trained), then the target's final norm and head rows (frozen)."""

    def __init__(self, head: ExitHead, norm: torch.nn.Module, rows: torch.Tensor):
        super().__init__()
        self.head, self.norm = head, norm.requires_grad_(False)
        self.register_buffer("rows", rows, persistent=False)  # [R, d]: the target's LM-head rows

    def forward(self, x: torch.Tensor, lens: bool = False) -> torch.Tensor:
        """x [N, d] -> log-probs over the rows [N, R]; lens=True: without the head (the logit lens)."""
        h = x if lens else self.head(x)
        return torch.log_softmax(F.linear(self.norm(h), self.rows).float(), dim=-1)

    def target_logp(self, feats: torch.Tensor) -> torch.Tensor:
        """The target's final log-probs over the rows [N, R] from its final features [N, d]."""
        return torch.log_softmax(F.linear(feats.to(self.rows.dtype), self.rows).float(), dim=-1)


def batch_of(table: dict, index: torch.Tensor, device) -> tuple:
    return tuple(table[k][index].to(device) for k in ("x", "feats", "label", "answer"))


def kl_loss(model: Exit, x, feats) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mean KL(target || exit) over the positions, the exit's log-probs [N, R], the target's [N, R])."""
    with torch.no_grad():
        target = model.target_logp(feats)
    logp = model(x.to(model.rows.dtype))
    return F.kl_div(logp, target, log_target=True, reduction="batchmean"), logp, target


def recall_counts(logp: torch.Tensor, label: torch.Tensor) -> torch.Tensor:
    """hit [N, len(KAPPAS)]: whether each label is among logp's top-kappa (never for IGNORE labels)."""
    inside = label != IGNORE
    own = logp.gather(-1, label.clamp_min(0)[:, None])  # [N, 1]
    rank = (logp > own).sum(-1, keepdim=True)  # [N, 1]: 0 for the top-1
    return (rank < torch.tensor(KAPPAS, device=logp.device)) & inside[:, None]


@torch.no_grad()
def evaluate(model: Exit, table: dict, batch_tokens: int, lens: bool = False) -> dict:
    """Held-out KL (every position) and top-kappa recall over answer positions (topK) and the hard ones
    among them (hard_topK); lens=True: the same for the logit lens."""
    n = len(table["label"])
    kl, answers, hard = 0.0, 0, 0
    hits, hard_hits = torch.zeros(len(KAPPAS), dtype=torch.long), torch.zeros(len(KAPPAS), dtype=torch.long)
    for start in range(0, n, batch_tokens):
        x, feats, label, answer = batch_of(table, torch.arange(start, min(n, start + batch_tokens)), model.rows.device)
        target = model.target_logp(feats)
        logp = model(x.to(model.rows.dtype), lens=lens)
        kl += F.kl_div(logp, target, log_target=True, reduction="sum").item()
        hit = recall_counts(logp, label)  # [B, K]
        is_hard = answer & (target.max(-1).values.exp() < HARD)
        hits, answers = hits + hit[answer].sum(0).cpu(), answers + int(answer.sum())
        hard_hits, hard = hard_hits + hit[is_hard].sum(0).cpu(), hard + int(is_hard.sum())
    result = dict(loss=kl / max(n, 1))
    result.update({f"top{k}": float(h) / max(answers, 1) for k, h in zip(KAPPAS, hits)})
    result.update({f"hard_top{k}": float(h) / max(hard, 1) for k, h in zip(KAPPAS, hard_hits)})
    return dict(result, answer_positions=answers, hard_positions=hard, positions=n)


DEFAULTS = Defaults(epochs=3.0, lr=2e-3, eval_every=100, batch_tokens=1024, holdout=0.1)


def train(data_dirs: Path | list[Path], out: Path, features: Path | None = None, exit_layer: int = 0,
          rank: int = 64, mlp: int = 0, draft: Path | str | None = "default", epochs: float = DEFAULTS.epochs,
          lr: float = DEFAULTS.lr, batch_tokens: int = DEFAULTS.batch_tokens, max_len: int = DEFAULTS.max_len,
          eval_every: int = DEFAULTS.eval_every, holdout: float = DEFAULTS.holdout, seed: int = DEFAULTS.seed,
          threads: int = DEFAULTS.threads, target_dir: Path | None = None, device: str = DEFAULTS.device) -> dict:
    """Train an early-exit head for the target in ``target_dir`` (default: the embedded target).

    exit_layer: the hidden state after this many target layers is the head's input (0: Mirror-SD's
    default exit layer). rank, mlp: the head's correction, SwiGLU with ``mlp`` hidden units where
    ``mlp`` > 0, else low rank ``rank`` (models/exit_head.py). draft: the draft whose vocabulary rows the exit scores ("default": the
    shipped draft for the embedded target, every row for another; None: every row).
    device: where the target computes features and the head trains (fp32 either way).
    """
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    start = time.time()
    embedded = target_dir is None
    target_dir = Path(target_dir) if target_dir else embedded_model_dir()
    target, _ = load_model(target_dir, resolve_device(device), torch.float32)
    exit_layer = exit_layer or default_exit_layer(target.num_layers)
    head = new_exit_head(target, exit_layer, rank, mlp)  # checks the exit layer before any feature is computed
    if draft == "default":
        draft = EMBEDDED_DRAFT if embedded else None
    vocab_map = draft_rows(draft, target)
    row_of = rows_of(vocab_map, target.args.vocab_size)
    seqs = example_sequences(target, read_examples(data_dirs), features_dir(features, target_dir), max_len,
                             batch_tokens=4096, early_layers=(exit_layer,))
    feature_s = time.time() - start
    order, n_eval = split_order(len(seqs), holdout, seed)
    exit_norm = target.model.layers[exit_layer].input_layernorm.weight.detach().float().cpu()
    held_out = position_table([seqs[i] for i in order[:n_eval]], exit_norm, row_of)
    train_set = position_table([seqs[i] for i in order[n_eval:]], exit_norm, row_of)
    model = Exit(head, target.model.norm, target.lm_head.weight.detach()[vocab_map.to(target.device)].clone())
    shape = dict(hidden_size=target.args.hidden_size, num_layers=target.num_layers, vocab_size=target.args.vocab_size)
    lens = run_evaluation(model, lambda: evaluate(model, held_out, batch_tokens, lens=True))
    n = len(train_set["label"])
    steps = max(1, n // batch_tokens)

    def epoch_batches(epoch: int) -> list[torch.Tensor]:  # the same count every epoch, as fit() needs
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        return list(perm[:steps * batch_tokens].view(steps, -1)) if n >= batch_tokens else [perm]

    def loss_of(index):
        x, feats, label, _ = batch_of(train_set, index, model.rows.device)
        loss, logp, _ = kl_loss(model, x, feats)
        top1 = recall_counts(logp.detach(), label)[:, 0].float().mean().item()
        return loss, dict(loss=loss.item(), top1=top1)

    state = fit(model, epoch_batches, loss_of, lambda: evaluate(model, held_out, batch_tokens), out, epochs, lr,
                eval_every, desc="train exit head")
    final = run_evaluation(model, lambda: evaluate(model, held_out, batch_tokens))
    folders = data_folders(data_dirs)
    card = dict(target=model_name(target_dir), exit_layer=exit_layer, architecture=head.architecture, **head.size, **shape,
                rows=len(vocab_map), draft=Path(draft).name if draft else None,
                data=[d.name for d in folders], sources=[data_source(d) for d in folders],
                examples_train=len(seqs) - n_eval, examples_held_out=n_eval, tokens_train=n, max_len=max_len,
                steps=state["step"], epochs=epochs, lr=lr, batch_tokens=batch_tokens, seed=seed,
                hardware=hardware_name(head.device), feature_extraction_s=round(feature_s, 1),
                train_wall_s=round(state["wall_s"], 1), trainable_parameters=sum(p.numel() for p in head.parameters()),
                held_out=_rounded(final), held_out_lens=_rounded(lens))
    save_exit_head(head, out, target, model_name(target_dir), card)
    model_card(card).write(out)
    return card


def _rounded(metrics: dict) -> dict:
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


def recall_table(c: dict) -> str:
    """The card's held-out table: top-kappa recall of the head and of the logit lens."""
    head, lens = c["held_out"], c["held_out_lens"]
    lines = ["| positions | exit | " + " | ".join(f"κ={k}" for k in KAPPAS) + " |",
             "|---|---|" + "---|" * len(KAPPAS)]
    groups = (("", f"answer ({head['answer_positions']:,})"), ("hard_", f"hard ({head['hard_positions']:,})"))
    for prefix, what in groups:
        for name, m in (("trained head", head), ("logit lens", lens)):
            lines.append(f"| {what} | {name} | " + " | ".join(f"{m[f'{prefix}top{k}']:.3f}" for k in KAPPAS) + " |")
    return "\n".join(lines)


def model_card(c: dict) -> ModelCard:
    """The card for the head folder: what it is, what it was trained on, what it reached."""
    rows = f"the {c['rows']:,} LM-head rows of the draft's vocabulary (`{c['draft']}`)" if c["draft"] else \
        f"all {c['rows']:,} LM-head rows"
    d = c["hidden_size"]
    correction = (f"down(silu(gate(x)) * up(x)), x = h / rms(h); gate, up: Linear({d} -> {c['mlp']}), down: "
                  f"Linear({c['mlp']} -> {d}, bias), down" if c.get("mlp") else
                  f"up(down(h / rms(h))), down: Linear({d} -> {c['rank']}), up: Linear({c['rank']} -> {d}, "
                  f"bias), up")
    architecture = f"""- Input: the target's hidden state h after {c['exit_layer']} of its {c['num_layers']} layers (Mirror-SD's
  exit layer).
- head(h) = h + rms(h) * {correction}
  started at zero (an untrained head is the logit lens); then the target's own final norm and LM head.
- {c['trainable_parameters']:,} parameters, stored in fp32 (model.safetensors); config.json records the
  target and the exit layer, which `load_exit_head` checks."""
    data = f"""- {c['examples_train']} training / {c['examples_held_out']} held-out examples built by
  `python -m mirror_sd.train data` ({data_line(c)}). Sources and licences: `docs/corpora.md`. The bench prompts
  (`mirror_sd/data/bench_prompts.jsonl`) are excluded from the data.
- The target's cached features over prompt + answer (the last {c['max_len']} tokens of each example), with
  the early features at layer {c['exit_layer']}: {c['tokens_train']:,} training positions."""
    training = f"""- Loss: KL(the target's final distribution || the exit's), both over {rows}, at every position.
- AdamW lr {c['lr']} (warm-up + cosine), {c['batch_tokens']} random positions per batch, {c['steps']} steps
  ({c['epochs']} epochs), seed {c['seed']}: {c['train_wall_s'] / 60:.1f} min on {trained_on(c)} ({features_took(c)}).
  Loss curve: loss.png."""
    held_out = f"""Top-κ recall: the share of held-out positions whose target token (the full head's argmax) is among
the exit's top κ, over the positions that predict answer tokens and over the hard ones among them (the
target's final top-1 probability below {HARD}: where drafts get rejected). Held-out KL: {c['held_out']['loss']:.3f}
(logit lens: {c['held_out_lens']['loss']:.3f}).

{recall_table(c)}

What this does to Mirror-SD's hit rate and speed: `docs/experiments/mirror.md`."""
    return ModelCard(
        title=f"Early-exit head for {c['target']} (exit layer {c['exit_layer']})",
        intro="""A trained early exit for `method="mirror"` at its exit layer: it chooses which
branches the draft rolls out, never what is committed (verification is unchanged, so decoding stays
lossless). Trained by `python -m mirror_sd.train exit-head` (code: `mirror_sd/train/exit_head.py`,
model: `mirror_sd/models/exit_head.py`).""",
        sections={"Architecture": architecture, "Data and licences": data, "Training": training,
                  "Held-out results": held_out})


def add_parser(sub):
    """``python -m mirror_sd.train exit-head ...``"""
    p = sub.add_parser("exit-head", help="train Mirror-SD's early-exit head for the target",
                       description="Compute the target's features with early features at the exit layer (cached "
                                   "in --features), then train a head on the exit layer's hidden states "
                                   "to match the target's final distribution. Resumable: rerun the same command.")
    o = TrainerOptions(p, DEFAULTS, holds="the head, its model card, loss.png, checkpoint/", rows="",
                       computes="the target computes features and the head trains")
    o.add("data", "out", "target", "features")
    p.add_argument("--exit-layer", type=non_negative_int, default=0,
                   help="the head reads the hidden state after this many target layers (default 0: mirror's "
                        "default exit layer, three quarters of the layers)")
    p.add_argument("--rank", type=positive_int, default=64,
                   help="rank of a low-rank head's correction (default 64)")
    p.add_argument("--mlp", type=non_negative_int, default=0,
                   help="hidden units of a SwiGLU head (a nonlinear correction, as the target's MLPs; the shipped "
                        "heads for layers 14 and 22 have 1536); 0: a low-rank head (default 0)")
    p.add_argument("--draft", default="default",
                   help="the draft whose vocabulary rows the exit scores, as mirror's early exit does (default: "
                        "the shipped draft for the embedded target, every row for another; none: every row)")
    o.add("epochs", "lr")
    p.add_argument("--batch-tokens", type=positive_int, default=DEFAULTS.batch_tokens,
                   help="positions per batch, drawn at random from every training example (default %(default)s)")
    p.add_argument("--holdout", type=positive_float, default=DEFAULTS.holdout,
                   help="share of the examples held out for evaluation (default %(default)s)")
    o.add("max_len", "eval_every", "seed", "threads", "device")

    def run(args):
        draft = None if args.draft.lower() == "none" else args.draft
        card = train([Path(d) for d in args.data], Path(args.out), exit_layer=args.exit_layer, rank=args.rank,
                     mlp=args.mlp, draft=draft, holdout=args.holdout, **train_kwargs(args))
        print(json.dumps(card, indent=2))
        return 0

    p.set_defaults(func=run)


def features_took(c: dict) -> str:
    """How long the target's features took, or that an earlier run's cache gave them."""
    minutes = c["feature_extraction_s"] / 60
    return f"features: {minutes:.1f} min" if minutes >= 0.05 else "features: read from the cache of an earlier run"
