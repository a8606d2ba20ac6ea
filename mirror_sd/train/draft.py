"""Train a draft for a target (by default the embedded one: the project's draft) by distillation.

The draft is a small Llama with the target's width (d = 576 for the embedded target). It reuses the
target's frozen input embedding, so that is not shipped, and has a few decoder layers, initialised
from the target's own layers. Its LM head covers a reduced vocabulary: the most frequent tokens of
the target's answers, with a ``vocab_map`` to target ids, as in EAGLE-3. Training is cross-entropy
on the target's greedy answers (the distilled data from ``python -m mirror_sd.train data``), so the
draft learns the target's argmax, which is what greedy verification accepts. With ``--labels
target`` every position is labelled with the target's argmax (prompt tokens too), from one target
pass over the data (``train/features.py``, the cache the EAGLE trainer uses).

Outputs in --out: model.safetensors (fp16, no embedding) + config.json + tokenizer files (a
loadable draft), checkpoint/ (resumable, safetensors + JSON, no pickle), loss.png, metrics.json.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from ..devices import hardware_name, resolve_device
from ..errors import MirrorSDError
from ..models.llama import Transformer
from ..models.loading import (EMBED_FROM_TARGET, VOCAB_MAP_KEY, embedded_model_dir, load_model, load_tokenizer,
                              model_name)
from .card import DECODING_NUMBERS, ModelCard, trained_on
from .data import IGNORE, build_vocab_map, data_folders, data_source, read_examples
from .features import extract_features, features_dir, load_sequences
from .loop import fit, run_evaluation
from .options import Defaults, TrainerOptions, layer_list, train_kwargs


def init_draft(target: Transformer, layers: list[int], vocab_map: torch.Tensor) -> Transformer:
    """A draft whose layers, final norm and head rows start as copies of the target's, on its device."""
    args = type(target.args)(**{**target.args.__dict__, "num_layers": len(layers), "tie_word_embeddings": False})
    draft = Transformer(args, head_size=len(vocab_map)).to(target.device)
    state = {"model.embed_tokens.weight": target.model.embed_tokens.weight,
             "model.norm.weight": target.model.norm.weight,
             "lm_head.weight": target.lm_head.weight[vocab_map.to(target.device)]}
    for new, old in enumerate(layers):
        for k, v in target.model.layers[old].state_dict().items():
            state[f"model.layers.{new}.{k}"] = v
    draft.load_state_dict({k: v.detach().clone() for k, v in state.items()}, strict=True)
    draft.model.embed_tokens.weight.requires_grad_(False)  # the target's, frozen
    draft.vocab_map = vocab_map
    return draft


def answer_labels(examples, vocab_map: torch.Tensor, max_len: int) -> list[tuple[list[int], list[int]]]:
    """[(ids, labels)]: labels on answer tokens only (head-row index of the next token, or IGNORE)."""
    row_of = {int(t): i for i, t in enumerate(vocab_map)}
    labelled = []
    for prompt, answer in examples:
        ids = (prompt + answer)[-max_len:]
        first_answer = len(ids) - len(answer)
        labels = [IGNORE] * len(ids)
        for i in range(max(first_answer, 1), len(ids)):
            labels[i - 1] = row_of.get(ids[i], IGNORE)
        labelled.append((ids, labels))
    return labelled


def target_labels(seqs: list[dict], vocab_map: torch.Tensor) -> list[tuple[list[int], list[int]]]:
    """[(ids, labels)]: at every position the target's argmax (from train/features.py), prompt included.

    On answer tokens it is the next token (the answers are the target's greedy choices); on prompt
    tokens it is what the target would have said there, which teaches the draft the target's habits
    on far more contexts than its answers alone.
    """
    row_of = {int(t): i for i, t in enumerate(vocab_map)}
    labelled = []
    for seq in seqs:
        ids, argmax = seq["ids"].tolist(), seq["argmax"].tolist()
        labels = [row_of.get(a, IGNORE) for a in argmax[:-1]] + [IGNORE]  # the last predicts past the end
        labelled.append((ids, labels))
    return labelled


def make_batches(labelled, batch_tokens: int, rng: random.Random):
    """Shuffled batches of similar length from [(ids, labels)]: ids [B, T] and labels [B, T]."""
    seqs = sorted(labelled, key=lambda s: len(s[0]))
    batches, current = [], []
    for seq in seqs:
        if current and (len(current) + 1) * len(seq[0]) > batch_tokens:
            batches.append(current)
            current = []
        current.append(seq)
    if current:
        batches.append(current)
    rng.shuffle(batches)
    for batch in batches:
        T = max(len(ids) for ids, _ in batch)
        ids = torch.tensor([s[0] + [0] * (T - len(s[0])) for s in batch])
        labels = torch.tensor([s[1] + [IGNORE] * (T - len(s[1])) for s in batch])
        yield ids, labels


def loss_and_accuracy(draft: Transformer, ids: torch.Tensor, labels: torch.Tensor):
    ids, labels = ids.to(draft.device), labels.to(draft.device)  # batches are built on the CPU
    logits = draft(ids, None)  # [B, T, head rows]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE)
    mask = labels != IGNORE
    correct = ((logits.argmax(-1) == labels) & mask).sum().item()
    return loss, correct, mask.sum().item()


def evaluate(draft, labelled, batch_tokens) -> dict:
    """Held-out loss and top-1 agreement with the target (a proxy for per-token acceptance)."""
    total_loss, correct, count = 0.0, 0, 0
    for ids, labels in make_batches(labelled, batch_tokens, random.Random(0)):
        loss, c, n = loss_and_accuracy(draft, ids, labels)
        total_loss += loss.item() * n
        correct, count = correct + c, count + n
    return dict(loss=total_loss / max(count, 1), top1=correct / max(count, 1), tokens=count)


def save_draft(draft: Transformer, out: Path, target_dir: Path, card: dict):
    """A loadable draft folder: fp16 weights without the borrowed embedding, config, tokenizer."""
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu", torch.float16).contiguous() for k, v in draft.state_dict().items()
             if k != "model.embed_tokens.weight"}
    state[VOCAB_MAP_KEY] = draft.vocab_map.cpu().clone()
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((target_dir / "config.json").read_text())
    config.update(num_hidden_layers=draft.num_layers, tie_word_embeddings=False, torch_dtype="float16",
                  **{EMBED_FROM_TARGET: True})
    config.pop("dtype", None)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    load_tokenizer(target_dir).save_pretrained(out)
    (out / "training.json").write_text(json.dumps(card, indent=2))


DEFAULTS = Defaults(epochs=2.0, lr=5e-4, eval_every=50)


def train(data_dirs: Path | list[Path], out: Path, layers: list[int], vocab_size: int = DEFAULTS.vocab_size,
          epochs: float = DEFAULTS.epochs, lr: float = DEFAULTS.lr, batch_tokens: int = DEFAULTS.batch_tokens,
          max_len: int = DEFAULTS.max_len, eval_every: int = DEFAULTS.eval_every, holdout: float = DEFAULTS.holdout,
          seed: int = DEFAULTS.seed, threads: int = DEFAULTS.threads, target_dir: Path | None = None,
          labels: str = "answers", features: Path | None = None, device: str = DEFAULTS.device) -> dict:
    """Train a draft for the target in ``target_dir`` (default: the embedded target); see module docstring.

    labels: "answers" (the next token on answer tokens) or "target" (the target's argmax at every
    position, from the features cache ``features``; see :func:`target_labels`). The held-out
    evaluation is on answer tokens either way. device: where the target and the draft compute
    (fp32 either way).
    """
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    target_dir = Path(target_dir) if target_dir else embedded_model_dir()
    target, _ = load_model(target_dir, resolve_device(device), torch.float32)
    if not layers or any(not 0 <= layer < target.num_layers for layer in layers):
        raise MirrorSDError(f"--layers must name target layers in 0..{target.num_layers - 1} (the target has "
                            f"{target.num_layers} layers); got {list(layers)}")
    examples = read_examples(data_dirs, targets_answers=labels == "answers")
    order = list(range(len(examples)))
    rng.shuffle(order)
    n_eval = max(1, int(len(examples) * holdout))
    held_out, train_ids = [examples[i] for i in order[:n_eval]], order[n_eval:]
    eos = load_tokenizer(target_dir).eos_token_id
    vocab_map = build_vocab_map([examples[i] for i in train_ids], vocab_size, {eos} - {None})
    if labels == "target":
        features = features_dir(features, target_dir)
        seqs = load_sequences(extract_features(target, examples, features, max_len), feats=False)
        train_set = target_labels([seqs[i] for i in train_ids], vocab_map)
    else:
        train_set = answer_labels([examples[i] for i in train_ids], vocab_map, max_len)
    held_out = answer_labels(held_out, vocab_map, max_len)
    draft = init_draft(target, layers, vocab_map)
    del target
    epoch_batches = lambda epoch: list(make_batches(train_set, batch_tokens, random.Random(seed + epoch)))

    def loss_of(batch):
        loss, correct, count = loss_and_accuracy(draft, *batch)
        return loss, dict(loss=loss.item(), top1=correct / max(count, 1))

    state = fit(draft, epoch_batches, loss_of, lambda: evaluate(draft, held_out, batch_tokens),
                out, epochs, lr, eval_every, desc="train draft")
    final = run_evaluation(draft, lambda: evaluate(draft, held_out, batch_tokens))
    card = dict(hardware=hardware_name(draft.device), target=model_name(target_dir), layers_from_target=layers, head_vocabulary=len(vocab_map),
                data=[d.name for d in data_folders(data_dirs)],
                data_sources=[data_source(d) for d in data_folders(data_dirs)],
                examples_train=len(train_set), examples_held_out=len(held_out), labels=labels,
                labelled_tokens=sum(sum(x != IGNORE for x in lab) for _, lab in train_set),
                steps=state["step"], epochs=epochs,
                lr=lr, batch_tokens=batch_tokens, seed=seed, wall_s=round(state["wall_s"], 1),
                held_out_loss=round(final["loss"], 4), held_out_top1=round(final["top1"], 4),
                trainable_parameters=sum(p.numel() for p in draft.parameters() if p.requires_grad))
    save_draft(draft, out, target_dir, card)
    model_card(card).write(out)
    return card


PROMPT_ORIGINS = {"corpora": "prompts built from offline corpora (QA, multi-turn, translation, math, summarization, RAG)",
                  "self-instruct": "user requests the target wrote itself (`--source self-instruct`)",
                  "reference": "corpus prompts with reference answers (`--source reference`)"}


def model_card(c: dict) -> ModelCard:
    """The card beside the weights: architecture, data, training and held-out results."""
    sources = dict.fromkeys(c.get("data_sources") or ["corpora"])  # in order, once each
    origins = " and to ".join(PROMPT_ORIGINS[s] for s in sources)
    labels = ("the target's argmax at every position, prompts included (" + f"{c['labelled_tokens']:,}"
              + " labelled tokens)" if c.get('labels') == 'target' else "the target's answer tokens")
    architecture = f"""- A Llama with the target's width and {len(c['layers_from_target'])} decoder layers, initialised from the target's layers
  {c['layers_from_target']}; the target's own input embedding (frozen, borrowed at load time, not stored here).
- LM head over {c['head_vocabulary']} tokens: the most frequent tokens of the training answers plus
  end-of-sequence, initialised from the target's head rows; `vocab_map` maps rows to target ids exactly.
  A token outside it is never proposed; verification always uses the target's full head (lossless).
- {c['trainable_parameters']:,} trained parameters, stored in fp16 (model.safetensors).
- `streams/` (when present): speculative streams for this draft, trained by
  `python -m mirror_sd.train ss --model <this folder>`; with them the draft proposes a window in one forward."""
    data = f"""{c['examples_train']} training / {c['examples_held_out']} held-out examples of the distilled data
(`python -m mirror_sd.train data`, folders: {", ".join(c['data'])}): the target's own greedy answers to
{origins}.
Sources and licences: `docs/corpora.md`. The bench prompts (`mirror_sd/data/bench_prompts.jsonl`) are excluded."""
    training = f"""Cross-entropy against {labels}, AdamW lr {c['lr']} (warm-up + cosine), {c['batch_tokens']} tokens
per batch, {c['steps']} steps ({c['epochs']} epochs), seed {c['seed']}, {c['wall_s'] / 60:.1f} min on {trained_on(c)}.
Loss curve: loss.png."""
    held_out = f"""- Top-1 agreement with the target: **{c['held_out_top1']:.3f}** (loss {c['held_out_loss']:.3f}).
{DECODING_NUMBERS}"""
    return ModelCard(
        title=f"Draft for {c['target']}",
        intro="The project's draft model (`load_pair()` uses it for `sd` and `mirror`), trained by\n"
              "`python -m mirror_sd.train draft` (code: `mirror_sd/train/draft.py`).",
        sections={"Architecture": architecture, "Data and licences": data, "Training": training,
                  "Held-out results (teacher-forced on the target's answers)": held_out})


def add_parser(sub):
    """``python -m mirror_sd.train draft ...``"""
    p = sub.add_parser("draft", help="train a draft for the target by distillation",
                       description="Train a small draft on distilled data (python -m mirror_sd.train data). "
                                   "Resumable: rerun the same command to continue from OUT/checkpoint.")
    o = TrainerOptions(p, DEFAULTS, holds="the loadable draft, loss.png, checkpoint/",
                       rows="draft head vocabulary: the most frequent answer tokens",
                       computes="the target and the draft compute")
    o.add("data", "out", "target")
    p.add_argument("--layers", default=[0, 1], type=layer_list,
                   help="target layers that initialise the draft's layers (default 0,1)")
    o.add("vocab", "epochs", "lr", "batch_tokens", "max_len", "eval_every")
    p.add_argument("--labels", choices=("answers", "target"), default="answers",
                   help="answers: next token on answer tokens (default); target: the target's argmax at every "
                        "position (prompts too; runs the target over the data once, cached in --features)")
    o.add("features", "seed", "threads", "device")

    def run(args):
        card = train([Path(d) for d in args.data], Path(args.out), args.layers, labels=args.labels, **train_kwargs(args))
        print(json.dumps(card, indent=2))
        return 0

    p.set_defaults(func=run)
