"""Train an EAGLE head for a target, by default the embedded one (``python -m mirror_sd.train eagle ...``).

Two stages, both resumable (rerun the same command to continue):

1. Features (``train/features.py``). The target runs once, causally and with no cache, over every
   distilled example (prompt + answer, the last ``--max-len`` tokens kept). Per token it stores the
   feature f_i (the final-normed hidden state the LM head reads, fp16) and the target's argmax at
   that position (full head, exact). Shards go to ``--features`` (default
   ~/.cache/mirror-sd/eagle-features). With ``--early-layers`` the shards also hold the target's
   early features at those layers (``models/eagle.py``).
2. Head. Input at position i: (f_i + noise, x_{i+1}); the head predicts f_{i+1}. Loss, as in
   EAGLE-1: smooth-L1(f^_{i+1}, f_{i+1}) + ``--ce-weight`` * cross-entropy of the reduced head's
   logits against the target's argmax at i+1 (the token greedy verification accepts). Prompt
   positions count too (the target's argmax is a valid label there).

   Training-time test (``--unroll U``, as in HASS / EAGLE-3): when drafting, depth s > 1 reads the
   head's *own* predicted features, which it never saw in plain training. With U > 1 the head is
   unrolled: pass s feeds every position p the pass-(s-1) prediction of f_p with the true next
   token, and its query sees what it would see at depth s of a draft (``unroll_mask``): the pass-1
   entries up to its anchor p-s+1 (true features) and, from each pass k = 2..s, the one entry of
   the same anchor. Pass s's loss is weighted ``UNROLL_DECAY`` ** (s-1); gradients flow through
   the predicted features. Held-out evaluation reports top-1 per depth over every position and
   over answer positions only (what drafting meets).

Outputs in --out: model.safetensors (fp16: fc, the decoder layer and the vocab_map; the embedding
and LM-head rows are the target's and are not stored), config.json, training.json (the model card
numbers), loss.png, metrics.json, checkpoint/ (resumable).
"""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..devices import resolve_device
from ..errors import MirrorSDError
from ..models.eagle import EagleHead, check_early_layers, load_head, save_head
from ..models.loading import embedded_model_dir, load_model, load_tokenizer, model_name
from .card import DECODING_NUMBERS, ModelCard, stage_history, stage_lines
from .data import IGNORE, ORIGIN, build_vocab_map, data_folders, data_source, read_examples
from .features import extract_features, features_dir, load_sequences
from .loop import fit, run_evaluation
from .options import Defaults, TrainerOptions, layer_list, non_negative_float, positive_int, train_kwargs

# -- stage 2: the head ---------------------------------------------------------------------------
def make_batches(seqs: list[dict], row_of: torch.Tensor, batch_tokens: int, rng: random.Random):
    """Batches of similar length: feats [B, T, d], next ids [B, T], target feats [B, T, d], labels [B, T],
    valid [B, T], answer [B, T] and early [B, T, n * d] (None where the sequences hold no early features).

    Position i holds input (f_i, x_{i+1}), target f_{i+1} and label row_of[argmax_{i+1}] (or IGNORE).
    Padded positions are not ``valid`` (no regression weight, label IGNORE). ``answer`` marks the
    positions whose label predicts an answer token (i + 1 >= the sequence's ``answer_start``, 0 if
    it has none): the positions a draft predicts when decoding.
    """
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]["ids"]))
    batches, current = [], []
    for i in order:
        if current and (len(current) + 1) * len(seqs[i]["ids"]) > batch_tokens:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    for batch in batches:
        T = max(len(seqs[i]["ids"]) for i in batch) - 1
        d = seqs[batch[0]]["feats"].shape[-1]
        feats, target = torch.zeros(len(batch), T, d), torch.zeros(len(batch), T, d)
        ids = torch.zeros(len(batch), T, dtype=torch.long)
        labels = torch.full((len(batch), T), IGNORE, dtype=torch.long)
        valid = torch.zeros(len(batch), T, dtype=torch.bool)
        answer = torch.zeros(len(batch), T, dtype=torch.bool)
        early = torch.zeros(len(batch), T, seqs[batch[0]]["early"].shape[-1]) if "early" in seqs[batch[0]] else None
        for row, i in enumerate(batch):
            s, n = seqs[i], len(seqs[i]["ids"]) - 1
            feats[row, :n], target[row, :n] = s["feats"][:-1].float(), s["feats"][1:].float()
            ids[row, :n], labels[row, :n], valid[row, :n] = s["ids"][1:], row_of[s["argmax"][1:]], True
            answer[row, max(0, s.get("answer_start", 0) - 1):n] = True
            if early is not None:
                early[row, :n] = s["early"][:-1].float()
        yield feats, ids, target, labels, valid, answer, early


UNROLL_DECAY = 0.8  # weight of unrolled pass s: UNROLL_DECAY ** (s - 1)


class GrowingCache:
    """The head's keys and values over unrolled passes, grown by concatenation so that gradients
    flow through every pass (``KVCache`` writes in place, which autograd cannot differentiate)."""

    max_slots = float("inf")

    def __init__(self):
        self.k = self.v = None
        self.length = 0

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor):
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)  # [B, K, start + T, D]
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v


def unroll_mask(T: int, s: int) -> torch.Tensor:
    """What pass s (1-based) at position p may attend to: [T, s * T] over the slots of passes 1..s.

    Pass 1 is causal. Pass s > 1 at p (anchor a = p - s + 1, its last true feature) sees pass-1
    slots j <= a and, in each pass k = 2..s, the slot of position a + k - 1: itself for k = s.
    """
    p = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    blocks = [j <= p - s + 1] + [j == p - s + k for k in range(2, s + 1)]
    return torch.cat(blocks, dim=1)


def unrolled_predictions(head: EagleHead, feats: torch.Tensor, ids: torch.Tensor, unroll: int,
                         early: torch.Tensor | None = None) -> list[torch.Tensor]:
    """The head's predicted features [B, T, d] for passes 1..unroll (module docstring).

    Pass s at position p is what the head outputs at depth s of a draft anchored at p - s + 1
    (its last true feature) when the tokens on the way are the true ones. Early features go with
    the true features of pass 1 only.
    """
    B, T = ids.shape
    if unroll == 1:
        return [head(feats, ids, None, early=early)]  # plain causal pass, no cache
    cache, positions, preds = GrowingCache(), torch.arange(T, device=ids.device).expand(B, T), []
    for s in range(1, unroll + 1):
        if s > 1:  # position p reads the previous pass's prediction of f_p (made at p - 1)
            feats = torch.cat([torch.zeros_like(preds[-1][:, :1]), preds[-1][:, :-1]], dim=1)
        preds.append(head(feats, ids, cache, positions, unroll_mask(T, s), early=early if s == 1 else None))
    return preds


def head_loss(head: EagleHead, batch, noise: float, ce_weight: float, unroll: int = 1):
    """(objective, per-pass stats) for one batch; stats: loss, feature_loss, correct top-1 and
    labelled tokens (all positions, and answer positions only), each a list over passes 1..unroll."""
    feats, ids, target, labels, valid, answer, early = (t if t is None else t.to(head.device) for t in batch)
    if early is None and head.early_layers:
        raise ValueError("this head reads early features, and the batch has none")
    if noise > 0:
        feats = feats + (torch.rand_like(feats) - 0.5) * noise
    objective, stats = 0.0, dict(loss=[], feature_loss=[], correct=[], count=[], answer_correct=[], answer_count=[])
    for s, pred in enumerate(unrolled_predictions(head, feats, ids, unroll, early), start=1):
        ok = valid.clone()
        ok[:, :s - 1] = False  # no anchor before position 0
        feature_loss = F.smooth_l1_loss(pred[ok], target[ok])
        logits = head.logits(pred)  # [B, T, rows]
        step_labels = labels.masked_fill(~ok, IGNORE)
        loss = feature_loss + ce_weight * F.cross_entropy(logits.flatten(0, 1), step_labels.flatten(),
                                                          ignore_index=IGNORE)
        objective = objective + UNROLL_DECAY ** (s - 1) * loss
        labelled = step_labels != IGNORE
        stats["loss"].append(loss.item())
        stats["feature_loss"].append(feature_loss.item())
        hit = (logits.argmax(-1) == step_labels) & labelled
        stats["correct"].append(hit.sum().item())
        stats["count"].append(labelled.sum().item())
        stats["answer_correct"].append((hit & answer).sum().item())
        stats["answer_count"].append((labelled & answer).sum().item())
    return objective, stats


def evaluate(head, seqs, row_of, batch_tokens: int, ce_weight: float, depths: int = 3) -> dict:
    """Held-out loss (pass 1) and top-1 agreement with the target's argmax at draft depths 1..``depths``
    (depth s: the head fed its own predictions s - 1 times; true tokens, as on an accepted path), over
    every position (top1_by_depth; top1 is its first entry) and over answer positions only
    (answer_top1_by_depth)."""
    loss, sums = 0.0, {k: [0] * depths for k in ("correct", "count", "answer_correct", "answer_count")}
    for batch in make_batches(seqs, row_of, batch_tokens, random.Random(0)):
        _, stats = head_loss(head, batch, 0.0, ce_weight, unroll=depths)
        loss += stats["loss"][0] * stats["count"][0]
        sums = {k: [a + b for a, b in zip(v, stats[k])] for k, v in sums.items()}
    top1, answer_top1 = ([c / max(n, 1) for c, n in zip(sums[f"{prefix}correct"], sums[f"{prefix}count"])]
                         for prefix in ("", "answer_"))
    return dict(loss=loss / max(sums["count"][0], 1), top1=top1[0], top1_by_depth=top1,
                answer_top1_by_depth=answer_top1, tokens=sums["count"][0], answer_tokens=sums["answer_count"][0])


def rows_of(vocab_map: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Target id -> head row [vocab_size] (IGNORE for ids outside the head's rows)."""
    row_of = torch.full((vocab_size,), IGNORE, dtype=torch.long)
    row_of[vocab_map.cpu()] = torch.arange(len(vocab_map))  # on the CPU, where batches are built
    return row_of


def example_sequences(target, examples, features: Path, max_len: int, batch_tokens: int,
                      early_layers=()) -> list[dict]:
    """The target's features over every example (cached in ``features``), with ``answer_start``."""
    seqs = load_sequences(extract_features(target, examples, features, max_len, batch_tokens, early_layers))
    for seq, (_, answer) in zip(seqs, examples):  # where the answer starts in the kept tokens
        seq["answer_start"] = max(0, len(seq["ids"]) - len(answer))
    return seqs


def split_order(count: int, holdout: float, seed: int) -> tuple[list[int], int]:
    """A seeded shuffle of the examples and how many of its first ones are held out."""
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return order, max(1, int(count * holdout))


DEFAULTS = Defaults(epochs=4.0, lr=1e-3, eval_every=50)


def train(data_dirs: Path | list[Path], out: Path, features: Path | None = None, vocab_size: int = DEFAULTS.vocab_size,
          epochs: float = DEFAULTS.epochs, lr: float = DEFAULTS.lr, batch_tokens: int = DEFAULTS.batch_tokens,
          max_len: int = DEFAULTS.max_len, eval_every: int = DEFAULTS.eval_every, holdout: float = DEFAULTS.holdout,
          noise: float = 0.2, ce_weight: float = 0.1, seed: int = DEFAULTS.seed, threads: int = DEFAULTS.threads,
          target_dir: Path | None = None, unroll: int = 1, init: Path | None = None, device: str = DEFAULTS.device,
          early_layers=None) -> dict:
    """Train an EAGLE head for the target in ``target_dir`` (default: the embedded target).

    unroll: passes of training-time test (module docstring; 1: plain EAGLE-1 training).
    init: a head folder to start from (its vocab_map is kept) instead of a fresh head.
    early_layers: target layers whose early features the head reads (``models/eagle.py``); None:
    those of the ``init`` head (none for a fresh head). A head given new early layers starts as it was.
    device: where the target computes features and the head trains (fp32 either way).
    """
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    start = time.time()
    target_dir = Path(target_dir) if target_dir else embedded_model_dir()
    target, _ = load_model(target_dir, resolve_device(device), torch.float32)
    examples = read_examples(data_dirs)
    head = load_head(Path(init), target) if init is not None else None
    if early_layers is None:
        early_layers = head.early_layers if head is not None else ()
    early_layers = check_early_layers(target, early_layers)  # before any feature is computed
    if head is not None and early_layers != head.early_layers:
        if head.early_layers:
            raise MirrorSDError(f"the head in {init} reads early layers {list(head.early_layers)}; "
                                f"it cannot go on with {list(early_layers)}")
        head = head.with_early_layers(target, early_layers)
    features = features_dir(features, target_dir)
    seqs = example_sequences(target, examples, features, max_len, batch_tokens, early_layers)
    feature_s = time.time() - start
    order, n_eval = split_order(len(seqs), holdout, seed)
    held_out, train_set = [seqs[i] for i in order[:n_eval]], [seqs[i] for i in order[n_eval:]]
    if head is not None:  # go on from a trained head, with its own rows
        head.requires_grad_(True)
        vocab_map = head.vocab_map
    else:
        eos = load_tokenizer(target_dir).eos_token_id
        held_ids = set(order[:n_eval])
        vocab_map = build_vocab_map([(e[0], e[1]) for i, e in enumerate(examples) if i not in held_ids],
                                    vocab_size, {eos} - {None})
        head = EagleHead.from_target(target, vocab_map, early_layers)
    row_of = rows_of(vocab_map, target.args.vocab_size)
    del target
    epoch_batches = lambda epoch: list(make_batches(train_set, row_of, batch_tokens, random.Random(seed + epoch)))

    def loss_of(batch):
        objective, stats = head_loss(head, batch, noise, ce_weight, unroll)
        return objective, dict(loss=objective.item(), feature_loss=stats["feature_loss"][0],
                               top1=stats["correct"][0] / max(stats["count"][0], 1))

    state = fit(head, epoch_batches, loss_of, lambda: evaluate(head, held_out, row_of, batch_tokens, ce_weight),
                out, epochs, lr, eval_every, desc="train eagle head")
    final = run_evaluation(head, lambda: evaluate(head, held_out, row_of, batch_tokens, ce_weight))
    folders = data_folders(data_dirs)
    card = dict(target=model_name(target_dir), data=[d.name for d in folders], sources=[data_source(d) for d in folders],
                hidden_size=head.args.hidden_size, head_vocabulary=len(vocab_map), examples_train=len(train_set),
                examples_held_out=len(held_out), tokens_train=sum(len(s["ids"]) for s in train_set),
                tokens_held_out=final["tokens"], max_len=max_len, steps=state["step"], epochs=epochs, lr=lr,
                batch_tokens=batch_tokens, noise=noise, ce_weight=ce_weight, seed=seed, unroll=unroll,
                early_layers=list(head.early_layers), init=str(init) if init else None,
                feature_extraction_s=round(feature_s, 1), train_wall_s=round(state["wall_s"], 1),
                held_out_loss=round(final["loss"], 4), held_out_top1=round(final["top1"], 4),
                held_out_top1_by_depth=[round(t, 4) for t in final["top1_by_depth"]],
                held_out_answer_top1_by_depth=[round(t, 4) for t in final["answer_top1_by_depth"]],
                answer_tokens_held_out=final["answer_tokens"],
                trainable_parameters=sum(p.numel() for p in head.parameters() if p.requires_grad))
    earlier = json.loads((Path(init) / "training.json").read_text()) if init else None
    card["stages"] = stage_history(earlier, card, stage_of)
    save_head(head, out, card)
    model_card(card).write(out)
    return card


def stage_of(card: dict) -> dict:
    """One training run's line in the model card (a head trained in stages lists each)."""
    keys = ("data", "steps", "epochs", "lr", "train_wall_s", "held_out_top1", "held_out_top1_by_depth")
    return dict({k: card.get(k) for k in keys}, unroll=card.get("unroll", 1))


def stage_line(stage: dict) -> str:
    unroll = stage["unroll"]
    kind = f"training-time test over {unroll} passes" if unroll > 1 else "plain (true features only)"
    depths = stage.get("held_out_top1_by_depth")
    reached = f"top-1 by depth {' / '.join(f'{t:.3f}' for t in depths)}" if depths else \
        f"top-1 {stage['held_out_top1']:.3f}"
    data = f" on {', '.join(f'`{d}`' for d in stage['data'])}" if stage.get("data") else ""
    return (f"  - {kind}{data}: {stage['steps']} steps ({stage['epochs']} epochs, lr {stage['lr']}) in "
            f"{stage['train_wall_s'] / 60:.1f} min; held-out {reached}")


def data_line(card: dict) -> str:
    """The card's sentence on this run's data: each folder and what it holds."""
    return "; ".join(f"`{d}`: {ORIGIN[s]}" for d, s in zip(card["data"], card["sources"]))


def early_line(card: dict) -> str:
    """The card's architecture line on early features, if the head reads any."""
    layers = card.get("early_layers")
    if not layers:
        return ""
    return (f"\n- Early features (EAGLE-3's fusion): the hidden states entering target layers {', '.join(map(str, layers))}, "
            f"each through that layer's input norm, go through fuse (Linear({len(layers)}d -> d), started at zero) "
            f"and are added to f_i wherever f_i is a true target feature.")


def model_card(c: dict) -> ModelCard:
    """The card for the head folder: what it is, what it was trained on, what it reached."""
    earlier = " Earlier stages' folders are named in Training below." if len(c["stages"]) > 1 else ""
    architecture = f"""- Input at position i: concat(target feature f_i, target embedding of x_(i+1)) -> Linear(2d -> d, bias)
  -> one Llama decoder layer (the target's shape: d = {c['hidden_size']}, GQA attention, SwiGLU MLP)
  -> predicted feature f^_(i+1). A feature is the target's final-normed hidden state.{early_line(c)}
- Tokens: the target's own frozen LM head, restricted to {c['head_vocabulary']} rows (the most frequent
  tokens of the first stage's training answers plus end-of-sequence, kept by later stages; `vocab_map`
  maps rows to target ids). Verification always uses the target's full head, so decoding stays lossless.
- Stored here (fp16): fc, the decoder layer and `vocab_map`: {c['trainable_parameters']:,} trained
  parameters. The embedding and LM-head rows are borrowed from the target at load time."""
    data = f"""- This run: {c['examples_train']} training / {c['examples_held_out']} held-out examples built by
  `python -m mirror_sd.train data` ({data_line(c)}).{earlier} Sources and licences are in `docs/corpora.md`
  (Wikipedia extracts CC BY-SA 4.0, chitchat-dataset MIT, chatterbot-corpus BSD, reasoning-gym Apache-2.0 /
  GSM8K MIT, this repository's templates). The target,
  SmolLM2-135M-Instruct, is Apache-2.0. The bench prompts (`mirror_sd/data/bench_prompts.jsonl`) are excluded
  from the data.
- Features over prompt + answer (the last {c['max_len']} tokens of each example): {c['tokens_train']:,} training
  tokens. Labels: the target's argmax at every position (full head)."""
    training = f"""- Loss: smooth-L1(f^, f) + {c['ce_weight']} x cross-entropy against the target's argmax; uniform noise of width
  {c['noise']} on input features; AdamW, warmup + cosine, {c['batch_tokens']} tokens per batch. Training-time
  test (`--unroll U`): the head is also run on its own predicted features, as at draft depths 2..U, with
  pass s weighted {UNROLL_DECAY} ** (s - 1) (see `mirror_sd/train/eagle.py`).
- On 2 shared CPU cores, in {len(c['stages'])} stage(s), each going on from the one before (`--init`):
{stage_lines(c['stages'], stage_line)}
- Feature extraction: one causal target forward per example, cached (this run: {c['feature_extraction_s'] / 60:.1f} min)."""
    held_out = f"""- Top-1 agreement with the target's argmax at draft depths 1 / 2 / 3 (depth s: the head fed its own
  predicted features s - 1 times, true tokens on the way): **{' / '.join(f'{t:.3f}' for t in c['held_out_top1_by_depth'])}**
  over every held-out position ({c['tokens_held_out']:,} tokens; depth-1 loss {c['held_out_loss']:.4f}), and
  **{' / '.join(f'{t:.3f}' for t in c['held_out_answer_top1_by_depth'])}** over the positions that predict answer
  tokens only ({c['answer_tokens_held_out']:,} tokens: what drafting meets; the prompts share a system prompt,
  which is easy to predict).
- Each run holds out 3% of the data it reads (a seeded shuffle). When a run goes on (`--init`) from a head
  trained on a smaller data set, its held-out split can hold examples an earlier stage trained on, so the
  stages' held-out numbers are not comparable across data sets; compare heads on the bench prompts
  (`research/compare_heads.py`).
{DECODING_NUMBERS}"""
    return ModelCard(
        title=f"EAGLE head for {c['target']}",
        intro="""An EAGLE-1 style draft head for `method="eagle"` (EAGLE-2 dynamic trees), trained on this project's
CPU with `python -m mirror_sd.train eagle` (code: `mirror_sd/train/eagle.py`, model:
`mirror_sd/models/eagle.py`).""",
        sections={"Architecture": architecture, "Data and licences": data, "Training": training,
                  "Held-out results": held_out})


def add_parser(sub):
    """``python -m mirror_sd.train eagle ...``"""
    p = sub.add_parser("eagle", help="train an EAGLE head for the target on its features",
                       description="Compute the target's features over the distilled data (cached in --features), "
                                   "then train an EAGLE-1 style head on them. Resumable: rerun the same command.")
    o = TrainerOptions(p, DEFAULTS, holds="the head, loss.png, checkpoint/",
                       rows="head vocabulary: the most frequent answer tokens",
                       computes="the target computes features and the head trains")
    o.add("data", "out", "target", "features", "vocab", "epochs", "lr", "batch_tokens", "max_len")
    p.add_argument("--noise", type=non_negative_float, default=0.2,
                   help="width of uniform noise on input features (default 0.2)")
    p.add_argument("--ce-weight", type=non_negative_float, default=0.1,
                   help="weight of the token loss; the feature loss weighs 1 (default 0.1)")
    p.add_argument("--unroll", type=positive_int, default=1,
                   help="training-time test: passes over the head's own predicted features (default 1: off)")
    p.add_argument("--init", default=None, help="start from the head in this folder instead of a fresh one")
    p.add_argument("--early-layers", default=None, type=layer_list,
                   help="comma-separated target layers whose early features the head also reads (EAGLE-3's "
                        "fusion; e.g. 2,15); default: those of --init, none for a fresh head")
    o.add("eval_every", "seed", "threads", "device")

    def run(args):
        card = train([Path(d) for d in args.data], Path(args.out), noise=args.noise, ce_weight=args.ce_weight,
                     unroll=args.unroll, init=args.init, early_layers=args.early_layers, **train_kwargs(args))
        print(json.dumps(card, indent=2))
        return 0

    p.set_defaults(func=run)
