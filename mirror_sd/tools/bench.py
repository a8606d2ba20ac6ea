"""Benchmark methods on a prompt set, Spec-Bench style: one run, same machine, same prompts.

The runs go prompt by prompt: on each prompt vanilla first, then every other method (or every
value of a swept option), so a slow spell of a shared machine slows all of them alike. Every run
is compared to vanilla token for token, and its wall-time speedup is measured against vanilla's
on the same prompts. Outputs in ``out_dir``: results.csv (one row per method and prompt),
summary.csv and summary.md (one row per method), by_category.csv (per method and category;
Mirror-SD's hit rate per category among them), spec_bench.csv and spec_bench.md (the run in Spec-Bench's
own report layout: spec_bench.py), acceptance_hist.csv and .html (tokens committed per step, per method
and task), and tuned_kernels.csv where stages were captured
with tuned kernels (each product's and attention's formulation and times: models/tuning.py); a
sweep writes results.csv, sweep.csv and sweep.html.
:func:`write_report` writes a one-page markdown report of a bench run (``bench --report``).
"""
from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from ..devices import cpu_cores, hardware_name
from ..engine import generate
from ..errors import MirrorSDError
from ..methods import get_method
from ..models import tuning
from . import spec_bench
from .spec_bench import BUNDLED_TASKS, MT_BENCH

DEFAULT_PROMPTS = Path(__file__).parents[1] / "data" / "bench_prompts.jsonl"
SPAN_PREFIX = "span_s_"  # results columns: seconds of spans of one kind over a prompt's decoding steps


def read_prompts(path: str | Path) -> list[dict]:
    """Prompts from JSONL: {"id", "category", "prompt"} or {"id", "category", "turns": [...]}, or Spec-Bench's
    ``question.jsonl`` as it is: {"question_id", "category", "turns", ...}, where the question's id is its id
    and MT-Bench's eight categories fold into the task ``mt_bench`` (the original kept as ``subcategory``).
    Every prompt also names its Spec-Bench ``task`` (the bundled prompts' multi-turn and math ones too)."""
    path = Path(path)
    if not path.exists():
        raise MirrorSDError(f"prompt file {path} does not exist")
    prompts = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as e:
            raise MirrorSDError(f"{path}:{n}: not valid JSON ({e.msg})") from None
        if not isinstance(item, dict):
            raise MirrorSDError(f"{path}:{n}: a line is a JSON object, {{\"id\", \"category\", \"prompt\"}} or "
                                f"{{\"id\", \"category\", \"turns\": [...]}}, not a {type(item).__name__}")
        turns = item.get("turns") or ([item["prompt"]] if "prompt" in item else None)
        if not turns or not all(isinstance(t, str) and t.strip() for t in turns):
            raise MirrorSDError(f"{path}:{n}: needs a non-empty \"prompt\" or \"turns\"")
        category = item.get("category", "none")
        if "question_id" in item and "id" not in item:  # Spec-Bench's question file
            task = "mt_bench" if category in MT_BENCH else category
            prompts.append(dict(id=str(item["question_id"]), category=task, subcategory=category, task=task,
                                turns=turns))
        else:
            prompts.append(dict(id=str(item.get("id", n)), category=category, turns=turns,
                                task=BUNDLED_TASKS.get(category, category)))
    if not prompts:
        raise MirrorSDError(f"{path} holds no prompts")
    return prompts


def first_per_category(prompts: list[dict], n: int) -> list[dict]:
    """The first n prompts of each category, in file order; a category folded from several (Spec-Bench's
    mt_bench) takes them in turn from each of its subcategories, so that n of them span its kinds."""
    seen: dict[tuple, int] = {}
    rank = []
    for order, item in enumerate(prompts):
        key = (item["category"], item.get("subcategory"))
        seen[key] = seen.get(key, 0) + 1
        rank.append((seen[key], order))  # k-th of its subcategory, then file order
    kept, counts = set(), {}
    for _, order in sorted(rank):
        category = prompts[order]["category"]
        if counts.get(category, 0) < n:
            kept.add(order)
            counts[category] = counts.get(category, 0) + 1
    return [item for order, item in enumerate(prompts) if order in kept]


def run_prompt(pair, item: dict, method: str, max_new_tokens: int, traces: list | None = None, **settings) -> dict:
    """Decode every turn of one prompt (later turns see this method's own earlier answers); each
    turn's Trace is appended to ``traces`` when given."""
    messages, token_ids, rows, hits, overlap_s, draft_busy_s, span_s = [], [], [], [], 0.0, 0.0, {}
    lengths = []  # tokens committed by each decoding step: the acceptance-length histogram's samples
    for turn in item["turns"]:
        messages.append({"role": "user", "content": turn})
        out = generate(pair, list(messages), method=method, max_new_tokens=max_new_tokens, **settings)
        if out.error:
            raise MirrorSDError(f"{method} on prompt {item['id']}: {out.error}")
        messages.append({"role": "assistant", "content": out.text})
        if traces is not None:
            traces.append(out.trace)
        token_ids += out.token_ids
        rows.append(out.metrics)
        hits += [st.rendezvous.hit for st in out.trace.steps if st.rendezvous is not None]
        lengths += [len(st.committed) for st in out.trace.steps if st.index > 0]  # step 0 is the prefill
        for span in out.trace.spans:  # decoding steps only: step 0 is the prefill
            if span.step:
                span_s[span.kind] = span_s.get(span.kind, 0.0) + span.duration
        target_lane, draft_lane = out.trace.lane_label("target"), out.trace.lane_label("draft")
        if target_lane and draft_lane:
            overlap_s += out.trace.overlap_seconds(draft_lane, target_lane)
            draft_busy_s += out.trace.busy_seconds().get(draft_lane, 0.0)
    new_tokens = sum(r["new_tokens"] for r in rows)
    steps = sum(r["steps"] for r in rows)
    wall_s = sum(r["wall_s"] for r in rows)
    committed_in_steps = sum(r["mean_accepted"] * r["steps"] for r in rows)
    draft_tokens, draft_forwards = (sum(r.get(k, 0) for r in rows) for k in ("draft_tokens", "draft_forwards"))  # sd
    return dict(method=method, id=item["id"], category=item["category"], task=item.get("task", item["category"]),
                new_tokens=new_tokens, steps=steps, accept_lengths=" ".join(map(str, lengths)),
                mean_accepted=committed_in_steps / steps if steps else 1.0, wall_s=wall_s,
                tokens_per_s=new_tokens / wall_s if wall_s else 0.0,
                hit_rate=sum(hits) / len(hits) if hits else None, hits=sum(hits), hit_steps=len(hits),
                overlap=overlap_s / draft_busy_s if draft_busy_s else None, overlap_s=overlap_s,
                draft_busy_s=draft_busy_s,
                draft_tokens=draft_tokens if draft_forwards else None, draft_forwards=draft_forwards or None,
                token_ids=token_ids,
                **{f"{SPAN_PREFIX}{kind}": seconds for kind, seconds in span_s.items()})


WARMUP_TOKENS = 8  # new tokens of each untimed warm-up run (run_interleaved)


def run_interleaved(pair, prompts: list[dict], runs: list[tuple[str, dict]], max_new_tokens: int,
                    desc: str = "bench", warmup: bool = True, traces: list | None = None, setup=None,
                    **settings) -> pd.DataFrame:
    """Rows of :func:`run_prompt` for every (method, options) in ``runs`` (the first is vanilla, the
    reference) on every prompt, prompt by prompt; column ``run`` is the index in ``runs``. A run may
    name a third item, the draft it decodes with (``pair.use_draft``: loaded once, then swapped in
    before each of its prompts).

    warmup: first run each once, untimed, for WARMUP_TOKENS on the first turn of the first prompt,
    so that one-time costs (weights packed for oneDNN on first use, a head or streams loaded, the
    first kernels set up) are charged to no method
    (measured: docs/experiments/bench.md#bench-runs-warm-up-and-run-to-run-noise).

    traces: when given, one dict per timed run is appended: method, id, category, new_tokens,
    wall_s and the run's traces (one per turn), for the what-if model's held-out check.

    setup: when given, ``setup(index)`` is called before each run (warm-up included) to put in
    place what run ``index`` needs beyond its method's options (research/: another setting, such
    as ``branches.use_scoring``).

    A run that fails (on its warm-up or on any prompt) is stopped and left out entirely, so that
    every row compares the same prompts; the others go on. The table's ``attrs["failed"]`` maps
    each stopped run's index to why. Vanilla failing stops everything: it is the reference."""
    failed: dict[int, str] = {}

    def attempt(index: int, *args, **kwargs) -> dict | None:
        try:
            return run_prompt(*args, **kwargs)
        except MirrorSDError as e:
            if index == 0:
                raise
            failed[index] = str(e)
            tqdm.write(f"note: {e}; this run is left out, the others go on", file=sys.stderr)
            return None

    def with_draft(index: int) -> tuple[str, dict]:
        if setup is not None:
            setup(index)
        method, options, *draft = runs[index]
        if draft and draft[0] is not None and draft[0] != pair.draft_name:
            pair.use_draft(draft[0])
        return method, options

    if warmup and prompts:
        first = dict(prompts[0], turns=prompts[0]["turns"][:1])
        for index in range(len(runs)):
            method, options = with_draft(index)
            attempt(index, pair, first, method, min(WARMUP_TOKENS, max_new_tokens), **settings, **options)
    rows, reference_ids, timed = [], {}, []
    with tqdm(total=len(runs) * len(prompts), desc=desc, unit="run") as bar:
        for item in prompts:
            for index in range(len(runs)):
                method, options = with_draft(index)
                bar.set_postfix_str(f"{item['id']} {method}")
                kept = {} if traces is None else dict(traces=[])
                row = None if index in failed else attempt(index, pair, item, method, max_new_tokens, **kept,
                                                           **settings, **options)
                bar.update()
                if row is None:
                    continue
                timed.append(dict(run=index, method=method, id=item["id"], category=item["category"],
                                  new_tokens=row["new_tokens"], wall_s=row["wall_s"], traces=kept.get("traces")))
                reference_ids.setdefault(item["id"], row["token_ids"])
                row["equal_to_vanilla"] = row.pop("token_ids") == reference_ids[item["id"]]
                rows.append(dict(row, run=index))
    if traces is not None:
        traces += [t for t in timed if t["run"] not in failed]
    table = pd.DataFrame([r for r in rows if r["run"] not in failed]).sort_values("run", kind="stable")
    spans = [c for c in table.columns if c.startswith(SPAN_PREFIX)]
    table = table[[c for c in table.columns if c not in spans] + spans].reset_index(drop=True)  # span seconds last
    table.attrs["failed"] = failed
    return table


def bench(pair, prompts: list[dict], methods: list[str], max_new_tokens: int = 128, out_dir: str | Path = "bench-out",
          options: dict | None = None, traces_dir: str | Path | None = None, **settings) -> pd.DataFrame:
    """Run every method on every prompt; write results.csv, summary.csv, by_category.csv, step_ms.csv,
    summary.md, the what-if model's held-out check (``whatif_check``) and, if any, the tuned
    kernels (tuned_kernels.csv) and the captured stages' replay times (stage_ms.csv); return the summary.
    traces_dir: also write every run's trace JSON there (METHOD-ID-turnK.json)."""
    methods = ["vanilla"] + [m for m in methods if m != "vanilla"]  # vanilla first: the reference
    check_options_taken(options or {}, methods)
    out = make_folder(out_dir, "the bench's output folder")  # before the runs, not after them
    if traces_dir:
        make_folder(traces_dir, "the traces folder")
    runs = [(m, _options_for(m, options or {})) for m in methods]
    traced: list[dict] = []
    results = run_interleaved(pair, prompts, runs, max_new_tokens, traces=traced, **settings)
    failed = {runs[index][0]: why for index, why in results.attrs["failed"].items()}
    results = results.drop(columns="run")
    summary = summarise(results)
    summary.attrs["failed"] = failed
    results.to_csv(out / "results.csv", index=False)
    summary.to_csv(out / "summary.csv", index=False)
    by_category = results.groupby(["method", "category"], sort=False).agg(
        mean_accepted=("mean_accepted", "mean"), tokens_per_s=("tokens_per_s", "mean"),
        hit_rate=("hit_rate", "mean"), equal_to_vanilla=("equal_to_vanilla", "mean")).reset_index()
    by_category.to_csv(out / "by_category.csv", index=False)
    steps = step_ms(results)
    steps.to_csv(out / "step_ms.csv", index=False)
    spec_section = write_spec_bench(results, out, pair, len(prompts), max_new_tokens, settings)
    summary.attrs["spec_bench"] = spec_section
    whatif_section = summary.attrs["whatif"] = whatif_check(traced, out)
    (out / "summary.md").write_text(
        summary.to_markdown(index=False, floatfmt=".3f") + "\n\n" + spec_section + "\nPer category:\n\n"
        + by_category.to_markdown(index=False, floatfmt=".3f") + "\n\nMean time per decoding step by span kind, "
        "in ms (spans on lanes that work at the same time both count):\n\n"
        + steps.to_markdown(index=False, floatfmt=".2f") + "\n" + whatif_section + failed_section(failed))
    if traces_dir is not None:
        write_traces(traced, Path(traces_dir))
    tuned = tuning.plan_table()
    if tuned:
        pd.DataFrame(tuned).to_csv(out / "tuned_kernels.csv", index=False)
    replays = stage_replay_ms(pair)
    if not replays.empty:
        replays.to_csv(out / "stage_ms.csv", index=False)
    return summary


def failed_section(failed: dict) -> str:
    """Markdown naming each run that failed and was left out (``run_interleaved``), and why."""
    if not failed:
        return ""
    return ("\nFailed, so left out of every table above (the other runs went on):\n\n"
            + "".join(f"- {name}: {why}\n" for name, why in failed.items()))


def stage_replay_ms(pair) -> pd.DataFrame:
    """Every captured stage the runs made, with the GPU time of one replay timed at its capture
    (CUDA events; models/stages.py), and what launching one costs (``Stage.time_launch``): model,
    stage, width, ms, launch_ms (the host's), from_idle_ms (the GPU's, from an idle stream). Empty
    where nothing was captured (the CPU). What a step's one-stage drafts and verifications cost the
    GPU, beside the forwards."""
    def launched(stages, name, width):
        stage = stages.made(name, width)
        return dict(launch_ms=getattr(stage, "launch_ms", None), from_idle_ms=getattr(stage, "from_idle_ms", None))

    rows = [dict(model=("target" if stages.model is pair.target else "draft" if stages.model is pair.draft
                        else type(stages.model).__name__), stage=name, width=width, ms=ms,
                 **launched(stages, name, width))
            for stages in pair.stage_sets.values() for name, by_width in stages.replay_ms.items()
            for width, ms in sorted(by_width.items())]
    return pd.DataFrame(rows, columns=["model", "stage", "width", "ms", "launch_ms", "from_idle_ms"])


def whatif_check(traced: list[dict], out: Path) -> str:
    """The what-if latency model (whatif.py) fitted on half the prompts' spans, predicting each
    method's speedup on the other half: writes whatif_check.csv and the fitted profile
    (profile-this-machine.json); returns the markdown section (empty with too few prompts)."""
    from .whatif import held_out_check

    try:
        profile, table = held_out_check(traced)
    except MirrorSDError:
        return ""
    table.to_csv(out / "whatif_check.csv", index=False)
    (out / "profile-this-machine.json").write_text(json.dumps(profile.to_json(), indent=1))
    worst = table.error.abs().max()
    return ("\nWhat-if model, held out: per-stage costs fitted on half the prompts' spans, each method's speedup "
            "predicted on the other half (error: modelled / measured - 1; "
            f"{'within' if worst <= 0.10 else 'NOT within'} 10%):\n\n"
            + table.to_markdown(index=False, floatfmt=".3f") + "\n")


def write_traces(traced: list[dict], folder: Path):
    """Every run's traces as Trace JSON (``Trace.from_json`` reads them back): METHOD-ID-turnK.json."""
    folder.mkdir(parents=True, exist_ok=True)
    for run in traced:
        for turn, trace in enumerate(run["traces"], start=1):
            name = f"{run['method']}-{run['id']}-turn{turn}.json".replace("/", "_")
            (folder / name).write_text(trace.to_json())


def step_ms(results: pd.DataFrame) -> pd.DataFrame:
    """Per method: mean milliseconds per decoding step spent in each kind of span (prefill excluded)."""
    kinds = [c for c in results.columns if c.startswith(SPAN_PREFIX)]
    per = results.groupby("method", sort=False)[kinds + ["steps"]].sum(min_count=1)
    table = 1000 * per[kinds].div(per["steps"], axis=0)
    return table.rename(columns=lambda c: c[len(SPAN_PREFIX):]).reset_index()


def summarise(results: pd.DataFrame) -> pd.DataFrame:
    """Per method: tau, tokens/s, speedup over vanilla (total wall time, same prompts), equality share, and
    Mirror-SD's hit rate and overlap, each over all the method's steps and time together (not a mean of
    the prompts' own)."""
    per = results.groupby("method", sort=False).agg(
        prompts=("id", "count"), new_tokens=("new_tokens", "sum"), steps=("steps", "sum"),
        wall_s=("wall_s", "sum"), equal_to_vanilla=("equal_to_vanilla", "mean"), hits=("hits", "sum"),
        hit_steps=("hit_steps", "sum"), overlap_s=("overlap_s", "sum"), draft_busy_s=("draft_busy_s", "sum"),
        draft_tokens=("draft_tokens", "sum"), draft_forwards=("draft_forwards", "sum"))
    per["hit_rate"] = per["hits"] / per["hit_steps"].where(per["hit_steps"] > 0)
    per["overlap"] = per["overlap_s"] / per["draft_busy_s"].where(per["draft_busy_s"] > 0)
    per["draft_tokens_per_forward"] = per["draft_tokens"] / per["draft_forwards"].where(per["draft_forwards"] > 0)
    per["mean_accepted"] = (results.assign(c=results.mean_accepted * results.steps)
                            .groupby("method", sort=False)["c"].sum() / per["steps"])
    per["tokens_per_s"] = per["new_tokens"] / per["wall_s"]
    per["speedup"] = per["tokens_per_s"] / per.loc["vanilla", "tokens_per_s"]
    cols = ["prompts", "new_tokens", "mean_accepted", "tokens_per_s", "speedup", "equal_to_vanilla", "hit_rate",
            "overlap", "draft_tokens_per_forward", "wall_s"]
    return per[cols].reset_index()


def equality_warning(summary: pd.DataFrame, temperature: float) -> str | None:
    """A warning naming the methods that committed other tokens than vanilla at temperature 0
    (at T > 0 the tokens differ by design: only their law must match); None when all agree."""
    if temperature > 0:
        return None
    off = summary[summary.equal_to_vanilla < 1]
    if off.empty:
        return None
    which = ", ".join(f"{row.method} on {round((1 - row.equal_to_vanilla) * row.prompts)} of {row.prompts} prompts"
                      for row in off.itertuples())
    return (f"warning: at temperature 0 these methods committed other tokens than vanilla: {which}. "
            "In fp32, or bf16 on a CPU (exact: models/exact.py), that is a fault; in fp16, or bf16 on a GPU, "
            "rounding that depends on how many tokens a forward holds can flip near-ties, so use fp32 there.")


def check_writable(path: str | Path, what: str, folder: bool = False):
    """Raise MirrorSDError unless ``path`` can be written: an existing file (or folder, with
    ``folder``) that is writable, or a new one under a writable folder. Creates nothing, so a bench
    can check its outputs before loading models."""
    path = Path(path).absolute()
    kind, other = ("folder", "file") if folder else ("file", "folder")
    if path.exists():
        if path.is_dir() != folder:
            raise MirrorSDError(f"{what} {path} is a {other}, not a {kind}")
        if not os.access(path, os.W_OK):
            raise MirrorSDError(f"{what} {path} is not writable")
        return
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise MirrorSDError(f"{what} {path} cannot be created: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise MirrorSDError(f"{what} {path} cannot be created: {parent} is not writable")


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def write_report(path: str | Path, summary: pd.DataFrame, command: str, pair, prompts: int, max_new_tokens: int):
    """A markdown page for one bench run: the command that produced it, the date, the machine, and
    one row per method of ``summary`` (:func:`summarise`): τ, speedup, tokens/s, the lanes it ran on
    and Mirror-SD's hit rate; then whether every method gave vanilla's tokens."""
    import torch

    lanes = pair.describe()  # as every trace's meta records them
    hardware = sorted({hardware_name(d) for lane in (pair.target_lane, pair.draft_lane) for d in lane.devices
                       if d.type != "cpu"})
    table = pd.DataFrame({
        "method": summary.method,
        "τ (tokens per step)": summary.mean_accepted.map("{:.3f}".format),
        "speedup vs vanilla": summary.speedup.map("{:.2f}×".format),
        "tokens/s": summary.tokens_per_s.map("{:.1f}".format),
        "device": [" + ".join(f"{lane.name} {lane.display_device}" for lane in get_method(m).lanes(pair))
                   for m in summary.method]})
    if summary.hit_rate.notna().any():
        table["hit rate (Mirror-SD)"] = summary.hit_rate.map(lambda r: "" if pd.isna(r) else f"{r:.3f}")
    off = summary[summary.equal_to_vanilla < 1]
    equality = ("Every method committed vanilla's tokens, token for token, on every prompt." if off.empty else
                "Not token-for-token equal to vanilla: " + ", ".join(
                    f"{row.method} on {round((1 - row.equal_to_vanilla) * row.prompts)} of {row.prompts} prompts"
                    for row in off.itertuples()) + " (expected at temperature > 0, where only the law must match).")
    page = "\n".join([
        "# Benchmark", "",
        f"Command: `{command}`", "",
        f"Date: {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC", "",
        f"Machine: {cpu_model()}, {cpu_cores()} CPU cores" + "".join(f", {h}" for h in hardware)
        + f"; torch {torch.__version__}; lanes: {lanes['target_lane']}"
        + (f"; {lanes['draft_lane']}" if pair.draft is not None else ""), "",
        f"Dtype: {lanes['dtype']}.", "",
        f"Models: target {lanes['target']}, " + (f"draft {lanes['draft']}" if lanes["draft"] else "no draft")
        + "".join(f"; {add_on}" for add_on in lanes["add_ons"]) + ".", "",
        f"{prompts} prompts, at most {max_new_tokens} new tokens per answer. τ: mean tokens committed per "
        "target step; speedup: tokens/s over vanilla's on the same prompts in the same run.", "",
        table.to_markdown(index=False, disable_numparse=True,
                          colalign=["left", "right", "right", "right", "left", "right"][:table.shape[1]]), "",
        equality, failed_section(summary.attrs.get("failed", {})),
        *(["", "## In Spec-Bench's layout", "", summary.attrs["spec_bench"]] if summary.attrs.get("spec_bench") else [])])
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(page, encoding="utf-8")


def _option_names(method: str) -> set[str]:
    return {o.name for o in get_method(method).options}


def check_options_taken(options: dict, methods: list[str]):
    """Refuse options that none of ``methods`` takes: dropped silently, they would label a run with
    settings it never ran."""
    taken = set().union(*(_option_names(m) for m in methods))
    unused = sorted(set(options) - taken)
    if unused:
        names = ", ".join("--" + name.replace("_", "-") for name in unused)
        raise MirrorSDError(f"{names}: taken by none of the methods run here ({', '.join(methods)}); "
                            "python -m mirror_sd methods lists each method's options")


def make_folder(path: str | Path, what: str) -> Path:
    """The folder ``path``, made if need be, or a MirrorSDError that says why it cannot be."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise MirrorSDError(f"{what} {path} cannot be made ({e.strerror or e})") from None
    return path


def write_spec_bench(results: pd.DataFrame, out: Path, pair, prompts: int, max_new_tokens: int, settings: dict) -> str:
    """Spec-Bench's report of the run (spec_bench.csv, spec_bench.md) and the acceptance-length
    histograms (acceptance_hist.csv, acceptance_hist.html); returns the markdown."""
    spec = spec_bench.table(results)
    spec.to_csv(out / "spec_bench.csv", index=False)
    caption = (f"Spec-Bench's layout: {prompts} questions, at most {max_new_tokens} new tokens per turn, temperature "
               f"{settings.get('temperature', 0.0):g}, target {pair.target_name}, draft {pair.draft_name}, on "
               f"{cpu_model() if pair.target_lane.device.type == 'cpu' else hardware_name(pair.target_lane.device)}; "
               "speedup: the mean of the questions' tokens/s over vanilla's mean (as its evaluation/speed.py).")
    text = spec_bench.markdown(spec, caption)
    (out / "spec_bench.md").write_text(text)
    hist = spec_bench.histogram(results)
    hist.to_csv(out / "acceptance_hist.csv", index=False)
    try:
        spec_bench.plot_histogram(hist, out / "acceptance_hist.html")
    except ImportError:  # a machine without requirements.txt's plotly: keep the numbers
        pass
    return text


def _options_for(method: str, options: dict) -> dict:
    """The subset of the given options that this method takes."""
    names = _option_names(method)
    return {k: v for k, v in options.items() if k in names}


def sweep(pair, prompts: list[dict], method: str, option: str, values: list, max_new_tokens: int = 128,
          out_dir: str | Path = "sweep-out", options: dict | None = None, **settings) -> pd.DataFrame:
    """Bench one method at several values of one option, against vanilla in the same run.

    Writes results.csv (one row per run and prompt; column ``option`` holds the value),
    sweep.csv (one row per value: tau, tokens/s, speedup, equality; then the method and the options
    given it besides the swept one, ``fixed``) and sweep.html (plotly).
    """
    names = _option_names(method)
    if option not in names:
        raise MirrorSDError(f"method {method!r} has no option {option!r} (it has: {', '.join(sorted(names)) or 'none'})")
    check_options_taken(options or {}, [method])
    out = make_folder(out_dir, "the sweep's output folder")
    base = _options_for(method, options or {})
    runs = [("vanilla", {})] + [(method, {**base, option: value}) for value in values]
    results = run_interleaved(pair, prompts, runs, max_new_tokens, desc=f"sweep {option}", **settings)
    failed = {values[index - 1]: why for index, why in results.attrs["failed"].items()}
    if len(failed) == len(values):
        raise MirrorSDError(f"{method} failed at every value of {option}: {next(iter(failed.values()))}")
    swept = [None if r == 0 else values[r - 1] for r in results.run]  # vanilla's rows have no value
    results.insert(1, option, pd.array(swept, dtype="Int64") if all(isinstance(v, int) for v in values) else swept)
    vanilla = results[results.run == 0]
    rows = []
    for index, value in enumerate(values, start=1):
        if value in failed:
            continue
        summary = summarise(pd.concat([vanilla, results[results.run == index]]).drop(columns=["run", option]))
        row = summary[summary.method == method].drop(columns="method")  # its columns keep their types
        row.insert(0, option, [value])
        rows.append(row)
    table = pd.concat(rows, ignore_index=True)
    table["method"] = method
    table["fixed"] = ", ".join(f"{k} {v}" for k, v in sorted(base.items()) if k != option)  # the options given
    table.attrs["failed"] = failed
    results.drop(columns="run").to_csv(out / "results.csv", index=False)
    table.to_csv(out / "sweep.csv", index=False)
    try:
        _plot_sweep(table, option, method, out / "sweep.html")
    except ImportError:  # a machine set up without requirements.txt (a lent GPU's image): keep the numbers
        print("note: plotly is not installed, so sweep.html was not written", file=sys.stderr)
    return table


def _plot_sweep(table: pd.DataFrame, option: str, method: str, path: Path):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(x=table[option], y=table["speedup"], name="speedup over vanilla", mode="lines+markers"))
    fig.add_trace(go.Scatter(x=table[option], y=table["mean_accepted"], name="mean accepted length",
                             mode="lines+markers"), secondary_y=True)
    fig.update_layout(title=f"{method}: sweep of {option}", xaxis_title=option, width=700, height=400)
    fig.write_html(path)
