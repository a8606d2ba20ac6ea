"""Distillation data: the target model's own greedy answers to prompts.

``python -m mirror_sd.train data --out DIR --seed S --num-prompts N [--source self-instruct]`` writes

* ``DIR/prompts.jsonl``: the prompts (messages, sources), as built from offline corpora
  (:mod:`.prompts`, the default) or sampled from the target itself (:mod:`.instruct`);
* ``DIR/data.jsonl``: one line per generated turn, ``{"id", "category", "source", "turn",
  "prompt_ids", "answer_ids"}``; ``prompt_ids`` is the chat-templated prompt (system prompt of
  the tokenizer's template + messages + ``<|im_start|>assistant\\n``), ``answer_ids`` the greedy
  continuation, ending with ``<|im_end|>`` (the eos) unless it was cut at ``--max-new-tokens``
  (``--source reference``: the corpus's own answer instead, nothing generated; see :mod:`.reference`);
* ``DIR/sources.json``: corpus packages, versions, licences, counts per category;
* ``DIR/README.md``: how the set was built (command, seed, counts, token totals, wall time).

Multi-turn prompts are generated turn by turn like the benchmark does: turn k's prompt holds the
target's own decoded answers to turns 1..k-1. Every turn is an example (id ``<prompt id>/t<k>``);
single-turn prompts keep their id.

Greedy decoding (temperature 0), fp32 (bf16 crashes on many CPUs), with the transformers model's
forward and KV cache in a continuous-batching loop (:func:`.generate.generate_stream`; token-identical
to ``generate(do_sample=False)``, checked in ``tests/test_train_data.py``). Prompts are sorted by length
before batching. Resumable: lines already in ``DIR/data.jsonl`` are skipped and new ones appended, and the
prompts are read back from ``DIR/prompts.jsonl``. ``--prompts-only`` writes the prompts and stops, so
they can be built where the corpora are installed and answered on another machine (a GPU).

On a CPU, throughput grows with the rows decoded together up to a batch of about 32 (the
``--batch-size`` default). Two threads are faster than one only on an otherwise idle machine, and
far slower when another process competes for a core, so ``--threads 1`` suits a niced background
run (measured: docs/experiments/cpu.md#distillation-data-on-the-cpu).
"""
from __future__ import annotations

import json
import os
import platform
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ..errors import MirrorSDError
from ..models.loading import EMBEDDED_NAME
from . import prompts as P
from .data import ORIGIN, encode_prompt, target_name
from .generate import SAMPLERS, generate_stream
from .instruct import ROUND, self_instruct_prompts

# must match to resume into the same folder
CONFIG_KEYS = ("source", "seed", "max_new_tokens", "round_size", "sampler", "target")


def _turn_ids(prompt: dict) -> list[str]:
    n = sum(m["role"] == "user" for m in prompt["messages"])
    return [prompt["id"]] if n == 1 else [f"{prompt['id']}/t{k}" for k in range(1, n + 1)]


def _read_done(path: Path) -> dict[str, dict]:
    """Rows already generated, by id. A torn last line (a killed run) is dropped and the file fixed."""
    done: dict[str, dict] = {}
    if not path.exists():
        return done
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    torn = False
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                torn = True
                break
            raise
        done[row["id"]] = row
    if torn or (text and not text.endswith("\n")):
        path.write_text("".join(json.dumps(r) + "\n" for r in done.values()), encoding="utf-8")
    return done


def _answer_text(tokenizer, answer_ids: list[int]) -> str:
    """What the benchmark puts in the assistant message: the decoded answer, special tokens dropped."""
    return tokenizer.decode(answer_ids, skip_special_tokens=True)


def _messages_for_turn(prompt: dict, k: int, done: dict, tokenizer) -> list[dict]:
    """The messages up to user turn k (1-based), earlier assistant turns filled from done."""
    out, seen_user = [], 0
    ids = _turn_ids(prompt)
    for m in prompt["messages"]:
        if m["role"] == "user":
            seen_user += 1
            out.append({"role": "user", "content": m["content"]})
            if seen_user == k:
                return out
        elif m["role"] == "assistant":
            content = m["content"]
            if content is None:
                content = _answer_text(tokenizer, done[ids[seen_user - 1]]["answer_ids"])
            out.append({"role": "assistant", "content": content})
        else:
            out.append(dict(m))
    raise ValueError(f"{prompt['id']} has no user turn {k}")


def load_target(threads: int, device: str = "cpu", target: str | None = None):
    """The target (a hub id or a local folder; None: the embedded one) as a transformers model in fp32
    on ``device`` (cpu, cuda[:N], ...), and its tokenizer, left-padding for batches."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ..devices import resolve_device
    from ..models.loading import resolve_model_dir

    torch.set_num_threads(threads)
    where = resolve_device(device)  # a clear error for a device this machine lacks
    folder = resolve_model_dir(target)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(where).eval()
    return folder, model, tokenizer


def _earlier_prompts(path: Path) -> list[dict]:
    """The prompts an earlier run wrote to prompts.jsonl (none if it wrote none)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _self_instruct(path: Path, model, tokenizer, args, stats: dict) -> list[dict]:
    """The first --num-prompts self-instruct prompts: an earlier run's prompts.jsonl (same seed: the
    config check) is read back, and sampling goes on after its last prompt if it holds too few."""
    old = _earlier_prompts(path)
    if path.exists():
        if len(old) >= args.num_prompts:
            stats.update(read_from=str(path))
            return old[:args.num_prompts]
        stats.update(went_on_from=f"{path} ({len(old)} prompts)")
    return self_instruct_prompts(model, tokenizer, args.num_prompts, args.seed, stats, args.round_size, earlier=old,
                                 sampling=args.sampler)


def _corpus_prompts(path: Path, args, stats: dict) -> list[dict]:
    """The corpus prompts: an earlier run's prompts.jsonl (same seed: the config check) when it holds
    exactly --num-prompts, so a folder made with --prompts-only where the corpora are installed can be
    answered on a machine without them (a GPU box); else built from the corpora."""
    old = _earlier_prompts(path)
    if len(old) == args.num_prompts:
        stats.update(read_from=str(path))
        return old
    return P.build_prompts(args.num_prompts, args.seed, stats=stats)


FILTER_FILE = "prompt-filter.json"  # what building the prompts dropped, for the runs that read them back


def _keep_filter_stats(path: Path, stats: dict) -> dict:
    """The counts of prompts dropped while building them: saved when the prompts are built, read
    back with them (a run after --prompts-only, or a resumed one), so every report keeps them."""
    if "read_from" in stats and path.exists():
        return {**json.loads(path.read_text()), **stats}
    path.write_text(json.dumps(stats) + "\n")
    return stats


def run_data(args) -> int:
    from tqdm import tqdm

    defaults = dict(round_size=ROUND, sampler=SAMPLERS[0], target=EMBEDDED_NAME)  # of folders from before these options
    args.round_size = args.round_size or defaults["round_size"]
    args.sampler = args.sampler or defaults["sampler"]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_path, prompts_path = out / "data.jsonl", out / "prompts.jsonl"
    config = dict(source=args.source, seed=args.seed, num_prompts=args.num_prompts,
                  max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, threads=args.threads,
                  device=args.device, round_size=args.round_size, sampler=args.sampler,
                  target=target_name(args.target))
    cfg_path = out / "config.json"
    if cfg_path.exists() and (data_path.exists() or prompts_path.exists()):
        old = {"source": "corpora", **defaults, **json.loads(cfg_path.read_text())}  # folders from before them
        bad = [k for k in CONFIG_KEYS if old.get(k) != config[k]]
        if bad:
            print(f"error: {out} was built with " + ", ".join(f"{k}={old.get(k)}" for k in bad)
                  + "; use another --out or the same settings", file=sys.stderr)
            return 2
    cfg_path.write_text(json.dumps(config, indent=2) + "\n")

    t0 = time.time()
    stats: dict = {}
    if args.source == "reference":
        return _run_reference(args, out, stats)
    if args.source == "self-instruct":
        folder, model, tokenizer = load_target(args.threads, args.device, args.target)
        if not getattr(tokenizer, "chat_template", None):
            raise MirrorSDError(f"--source self-instruct needs a chat model: {folder} has no chat template to "
                                "write user turns in (use --source corpora)")
        prompts = _self_instruct(prompts_path, model, tokenizer, args, stats)
    else:
        prompts = _corpus_prompts(prompts_path, args, stats)
    stats = _keep_filter_stats(out / FILTER_FILE, stats)
    with prompts_path.open("w", encoding="utf-8") as f:
        for p in prompts:
            f.write(json.dumps(p, ensure_ascii=False) + "\n")
    print(f"{len(prompts)} prompts in {time.time() - t0:.1f}s ({stats})", flush=True)
    if args.prompts_only:
        print(f"prompts only: answer them with the same command without --prompts-only (here, or on a "
              f"machine without the corpora, given {out})", flush=True)
        return 0
    if args.source != "self-instruct":
        folder, model, tokenizer = load_target(args.threads, args.device, args.target)

    done = _read_done(data_path)
    wanted = {i for p in prompts for i in _turn_ids(p)}
    total = len(wanted)
    already = len(wanted & done.keys())
    max_turns = max(len(_turn_ids(p)) for p in prompts)

    run_start = time.time()
    new_answer_tokens = 0
    bar = tqdm(total=total, initial=already, unit="ex", dynamic_ncols=True, mininterval=10, file=sys.stderr)
    with data_path.open("a", encoding="utf-8") as f:
        for k in range(1, max_turns + 1):
            jobs = []
            for p in prompts:
                ids = _turn_ids(p)
                if len(ids) < k or ids[k - 1] in done:
                    continue
                ids_ = encode_prompt(tokenizer, _messages_for_turn(p, k, done, tokenizer))
                jobs.append((len(ids_), p, ids[k - 1], ids_))
            jobs.sort(key=lambda j: (j[0], j[2]))
            stream = generate_stream(model, tokenizer, [j[3] for j in jobs], args.batch_size, args.max_new_tokens)
            last_flush = time.time()
            for i, ans in stream:
                _, p, eid, pids = jobs[i]
                row = dict(id=eid, category=p["category"], source=p["source"], turn=k,
                           prompt_ids=pids, answer_ids=ans)
                f.write(json.dumps(row) + "\n")
                done[eid] = row
                new_answer_tokens += len(ans)
                if time.time() - last_flush > 10:
                    f.flush()
                    last_flush = time.time()
                bar.update(1)
                bar.set_postfix_str(f"turn {k}, {new_answer_tokens / (time.time() - run_start):.1f} answer tok/s",
                                    refresh=False)
            f.flush()
    bar.close()
    wall = time.time() - run_start

    rows = [done[i] for p in prompts for i in _turn_ids(p) if i in done]
    _write_reports(out, args, prompts, rows, stats, wall, new_answer_tokens, tokenizer, folder)
    print(f"done: {len(rows)} examples in {out} ({wall / 60:.1f} min this run, "
          f"{new_answer_tokens} new answer tokens, {new_answer_tokens / max(wall, 1e-9):.1f} tok/s)", flush=True)
    return 0


def _run_reference(args, out: Path, stats: dict) -> int:
    """--source reference: prompts with reference answers from the corpora; no model writes anything."""
    from transformers import AutoTokenizer

    from ..models.loading import resolve_model_dir
    from .reference import build_reference_prompts, reference_rows

    t0 = time.time()
    folder = resolve_model_dir(args.target)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompts = build_reference_prompts(args.num_prompts, args.seed, stats=stats)
    rows = reference_rows(prompts, tokenizer, args.max_new_tokens)
    for name, items in (("prompts.jsonl", prompts), ("data.jsonl", rows)):
        with (out / name).open("w", encoding="utf-8") as f:
            f.writelines(json.dumps(x, ensure_ascii=False) + "\n" for x in items)
    wall = time.time() - t0
    _write_reports(out, args, prompts, rows, stats, wall, 0, tokenizer, folder)
    print(f"done: {len(rows)} examples in {out} ({wall:.1f}s, reference answers: nothing generated)", flush=True)
    return 0


def _write_reports(out: Path, args, prompts, rows, stats, wall, new_tokens, tokenizer, folder):
    eos = tokenizer.eos_token_id
    present = {p["category"] for p in prompts}   # the six categories in their order, then any others
    names = [c for c in P.CATEGORIES if c in present] + sorted(present - set(P.CATEGORIES))
    cats = {c: dict(prompts=0, examples=0, prompt_tokens=0, answer_tokens=0, cut_at_max=0) for c in names}
    for p in prompts:
        cats[p["category"]]["prompts"] += 1
    for r in rows:
        c = cats[r["category"]]
        c["examples"] += 1
        c["prompt_tokens"] += len(r["prompt_ids"])
        c["answer_tokens"] += len(r["answer_ids"])
        c["cut_at_max"] += not r["answer_ids"] or r["answer_ids"][-1] != eos
    tot = {k: sum(c[k] for c in cats.values()) for k in next(iter(cats.values()))}
    max_prompt = max((len(r["prompt_ids"]) for r in rows), default=0)

    runs_path = out / "runs.json"
    runs = json.loads(runs_path.read_text()) if runs_path.exists() else []
    runs.append(dict(finished=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                     command="python -m mirror_sd.train " + " ".join(shlex.quote(a) for a in sys.argv[1:]), wall_s=round(wall, 1),
                     new_answer_tokens=new_tokens, batch_size=args.batch_size, threads=args.threads,
                     device=args.device, host=platform.node(), cpus=os.cpu_count()))
    runs_path.write_text(json.dumps(runs, indent=2) + "\n")

    sources = P.source_versions()
    counts = P.source_counts(prompts)
    for name, row in sources.items():
        row["prompts_per_category"] = counts.get(name, {})
    (out / "sources.json").write_text(json.dumps(dict(
        sources=sources, categories=cats, totals=tot, filter=stats,
        held_out=str(P.BENCH_PATH.relative_to(P.BENCH_PATH.parents[2])),
    ), indent=2, ensure_ascii=False) + "\n")

    total_wall = sum(r["wall_s"] for r in runs)
    target = target_name(args.target)
    eos_text = f"`{tokenizer.eos_token}`" if getattr(tokenizer, "eos_token", None) else "the end-of-sequence token"
    lines = [
        f"# Distillation data for {'SmolLM2-135M-Instruct' if target == EMBEDDED_NAME else target}",
        "",
        ORIGIN[args.source] + (
            f". Answers end with {eos_text}, cut at {args.max_new_tokens} tokens. For the EAGLE head, which "
            "learns the target's features over any text." if args.source == "reference" else
            ": greedy (temperature 0), fp32, transformers model + KV cache with continuous batching "
            f"(token-identical to `generate(do_sample=False)`), at most {args.max_new_tokens} new tokens per turn, "
            f"stop at {eos_text}."),
        "",
        "Built with:",
        "",
        "```",
        f"python -m mirror_sd.train data --out {out} "
        + (f"--target {args.target} " if target != EMBEDDED_NAME else "") +
        f"--source {args.source} --seed {args.seed} "
        f"--num-prompts {args.num_prompts} "
        + (f"--round-size {args.round_size} --sampler {args.sampler} " if args.source == "self-instruct" else "") +
        f"--max-new-tokens {args.max_new_tokens} --batch-size {args.batch_size} --threads {args.threads} "
        f"--device {args.device}",
        "```",
        "",
        f"Target: `{folder}`"
        + (" (the engine's cached safetensors of the embedded GGUF)" if target == EMBEDDED_NAME else "")
        + (". Chat template with its default system prompt." if getattr(tokenizer, "chat_template", None) else
           ". No chat template: each prompt's turns as plain text, joined by newlines.")
        + ("" if not any(len(_turn_ids(p)) > 1 for p in prompts) else
           " Multi-turn prompts hold the reference answers of their earlier turns." if args.source == "reference" else
           " Multi-turn prompts are answered turn by turn, each later turn seeing the target's own decoded "
           "earlier answers (as `mirror_sd/tools/bench.py` does)."),
        "",
        "Files: `data.jsonl` (one line per turn: id, category, source, turn, prompt_ids, "
        "answer_ids), `prompts.jsonl` (the prompts as messages), `sources.json` (packages, versions, "
        "licences, counts), `config.json`, `runs.json` (each invocation), `prompt-filter.json` (what "
        "building the prompts dropped).",
        "",
        "| category | prompts | examples | prompt tokens | answer tokens | cut at max |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for c, v in cats.items():
        lines.append(f"| {c} | {v['prompts']} | {v['examples']} | {v['prompt_tokens']} | "
                     f"{v['answer_tokens']} | {v['cut_at_max']} |")
    lines.append(f"| **total** | {tot['prompts']} | {tot['examples']} | {tot['prompt_tokens']} | "
                 f"{tot['answer_tokens']} | {tot['cut_at_max']} |")
    lines += [
        "",
        f"Longest prompt: {max_prompt} tokens. Prompts dropped while building: {stats}.",
        f"Built in {wall:.0f} s (nothing generated)." if args.source == "reference" else
        f"Wall time: {total_wall / 60:.1f} min over {len(runs)} invocation(s) "
        f"(last: {wall / 60:.1f} min, {new_tokens} answer tokens, "
        f"{new_tokens / max(wall, 1e-9):.1f} tok/s, batch {args.batch_size}, {args.threads} threads, on {args.device}).",
        "",
        "## Sources",
        "",
        "| package | version | licence | prompts |",
        "|---|---|---|---:|",
    ]
    for name, row in sources.items():
        n = sum(row["prompts_per_category"].values())
        if not n:
            continue
        lines.append(f"| {name} | {row.get('installed_version') or row['version'] or '-'} | {row['licence']} | {n} |")
    lines += ["", "Held-out: no prompt equals, contains or shares an 8-word sequence with "
              "`mirror_sd/data/bench_prompts.jsonl`.", ""]
    (out / "README.md").write_text("\n".join(lines), encoding="utf-8")
