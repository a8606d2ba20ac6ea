"""``python -m mirror_sd gpu-check --out DIR``: what a session with a GPU runs first, in one go.

GPU time comes rarely and in short spells (docs/devices.md: how to carry the model there), so one
command does everything the CPU cannot inside a time budget (``--budget``, model set-up included;
by default it fits one 10-minute command), most telling part first, and writes what it found into
DIR:

1. one CUDA-graph replay of each fixed-shape stage (models/stages.py; Mirror-SD's early exit, the
   streams' pass and the EAGLE head's forward too) at every bucketed width, timed with CUDA events
   (the GPU's own time, no host launches), and the two lanes' graphs side by side
   on two streams: a hardware profile in the format of ``mirror_sd/tools/profiles/*.json`` (whatif.py),
   ``profile-<gpu>.json``; then why the target's time moves with the width (mirror_sd/tools/kernels.py:
   its top kernels at widths 1, 8 and 32, and its replays with TF32 products and in bf16), and
   which widths the stages route to a wider, cheaper bucket, and each tuned operation's time in
   every formulation models/tuning.py tries (products, attention, norms, rotary embeddings, q/k/v
   and the MLP's gate and up), with the one chosen;
2. the bench (vanilla, sd, eagle, ss, mirror; 2 prompts per category, 64 tokens, T = 0) on this
   machine's default devices with ``--graphs on`` (the methods on captured stages, each window at
   its cheapest bucket; Mirror-SD's steps queued on the two streams), then every method with
   ``--kernels default`` (what the tuned kernels win), then again with ``--buckets smallest``
   (what that routing wins): ``bench-*/`` and ``bench-*.md``; after the
   graphs-on bench, the host's time per step and per phase fitted on its traces, added to the
   stage profile: ``profile-<gpu>-graphs-host.json`` (whatif.py: ``fit_host``);
3. the CUDA tests (``tests/test_cuda.py``; ``tests/test_stages.py``, whose graph tests run only
   on a GPU; ``tests/test_graphs.py``, every method on the tiny pair's captured stages there):
   ``tests.log``;
4. the bench again with ``--graphs off`` (the plain forward), then with ``--draft-device cpu``
   (graphs on the GPU target only);
5. ``report.md``: the machine, each part's outcome and time, the stage table, the bench tables,
   what each kind of step cost with graphs on (from that bench's traces; ``trace.step_cost_table``),
   the replay time of every stage that bench captured (its ``stage_ms.csv``), what launching each
   costs the host and the GPU (``Stage.time_launch``), and any one-stage forward a part refused to
   capture, with why (the parts' logs).
   It is written again after every part, so a run stopped from outside keeps what it finished.

A part that fails or runs out of time is reported and the next one runs; a part that the budget
no longer leaves ``LEAST_S`` seconds for is reported as skipped. Without CUDA the command says so
in one line and exits 2.
"""
from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd
import torch

from ..devices import hardware_name
from ..errors import MirrorSDError
from ..models import tuning
from ..models.stages import BUCKETS, routed_widths
from ..trace import Trace, step_cost_table
from .kernels import EVERY, PROFILED_WIDTHS, format_times, kernel_table
from .whatif import Profile, fit_host, measured_seconds, modelled_seconds

ROOT = Path(__file__).resolve().parents[2]  # the repository (tests/ lives there)
BUDGET_S = 450  # every part together, model set-up included: one 10-minute device command, with room to unpack
TESTS = ["tests/test_cuda.py", "tests/test_stages.py", "tests/test_graphs.py"]
BENCH = ["--methods", "vanilla,sd,eagle,ss,mirror", "--per-category", "2", "--max-new-tokens", "64"]
BENCHES = [  # (part, extra arguments, most seconds): graphs on, graphs off, the draft on the CPU
    ("bench-graphs-on", ["--graphs", "on", "--traces", "{out}/traces"], 150),
    ("bench-default-kernels", ["--graphs", "on", "--kernels", "default"], 150),
    ("bench-smallest-bucket", ["--graphs", "on", "--buckets", "smallest"], 150),
    ("bench-graphs-off", ["--graphs", "off"], 150),
    ("bench-draft-cpu", ["--graphs", "auto", "--draft-device", "cpu"], 150),
]
BENCH_TITLES = {"bench-graphs-on": "the methods on CUDA graphs (--graphs on), each window at its cheapest bucket",
                "bench-default-kernels": "CUDA graphs, PyTorch's default kernels (--kernels default), "
                                         "against the tuned ones in bench-graphs-on",
                "bench-smallest-bucket": "CUDA graphs, each window at its smallest bucket (--buckets smallest)",
                "bench-graphs-off": "the plain forward (--graphs off)",
                "bench-draft-cpu": "the draft on the CPU, the target on CUDA graphs (--draft-device cpu)"}
CACHE_SLOTS = 1024  # the stages' cache: attention reads every slot, so a stage's cost depends on it
REPLAYS = 20  # timed replays per stage and width (the median is kept)
LEAST_S = 30  # a part the budget leaves less time than this for is skipped
SKIPPED = "skipped: the time budget ran out"
# What the stage profile's source says it leaves out; the host fit fills step_ms in (``_host_part``).
NOT_MEASURED = "Not measured here: rendezvous_ms, channel_ms, step_ms (0)."


def gpu_check(out: Path, budget_s: float = BUDGET_S) -> int:
    """Run every part into ``out`` within ``budget_s`` seconds; 0 when each part passed, 1 otherwise."""
    if not torch.cuda.is_available():
        raise MirrorSDError("gpu-check needs a CUDA GPU, and this machine has none (torch.cuda.is_available() is False)")
    if budget_s < 60:
        raise MirrorSDError(f"--budget {budget_s:g}: gpu-check needs at least 60 seconds")
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s
    gpu = torch.cuda.get_device_name(0)
    parts = []

    def done(part: dict):
        parts.append(part)
        write_report(out, parts, gpu, budget_s)

    stages = _stage_part(out, deadline)
    done(stages)  # the quickest sign that capture works
    for name, extra, limit in BENCHES:
        command = [sys.executable, "-m", "mirror_sd", "bench", *BENCH, *[a.format(out=out / name) for a in extra],
                   "--out", str(out / name), "--report", str(out / f"{name}.md")]
        done(_run(out, name, command, deadline, limit))
        if name == "bench-graphs-on" and stages.get("profile"):  # in process, a second or so
            done(_host_part(out, stages["profile"], out / name / "traces"))
        if name == "bench-smallest-bucket":  # the headline first, then the tests that say why it failed, if it did
            done(_run(out, "tests", [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider"],
                      deadline, limit=180))
    print(f"wrote {out / 'report.md'}")
    return 0 if all(p["ok"] for p in parts) else 1


def _run(out: Path, name: str, command: list[str], deadline: float, limit: int) -> dict:
    """A subprocess part, its output in ``<name>.log``, stopped at ``limit`` s or the deadline."""
    timeout = min(limit, deadline - time.monotonic())
    shown = ["python", *command[1:]] if command[0] == sys.executable else command
    part = dict(name=name, command=" ".join(shown), ok=False)
    if timeout < LEAST_S:
        return dict(part, outcome=SKIPPED, wall_s=0.0)
    print(f"gpu-check: {name} (at most {timeout:.0f} s) ...", flush=True)
    start = time.monotonic()
    log = out / f"{name}.log"
    try:
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        log.write_text(proc.stdout + proc.stderr, encoding="utf-8")
        lines = [line for line in (proc.stdout + proc.stderr).strip().splitlines() if "%|" not in line]  # no bars
        last = f": {lines[-1][:200]}" if lines else ""
        part.update(ok=proc.returncode == 0, outcome=f"exit {proc.returncode}{last}")
    except subprocess.TimeoutExpired as e:
        log.write_text(_text(e.stdout) + _text(e.stderr), encoding="utf-8")
        part.update(outcome=f"stopped after {timeout:.0f} s (time budget)")
    part["wall_s"] = time.monotonic() - start
    return part


def _host_part(out: Path, profile: dict, traces: Path) -> dict:
    """The stage profile with the host's time added: ``step_ms`` and ``phase_ms`` fitted on the
    graphs-on bench's traces (whatif.fit_host: each run's measured time less what the replays make
    of it), written as ``profile-<gpu>-graphs-host.json``; and how that profile re-times the bench,
    per method (measured against modelled seconds)."""
    part = dict(name="host-fit", command="in process: whatif.fit_host over bench-graphs-on's traces", ok=False)
    start = time.monotonic()
    try:
        runs = [Trace.from_json(p.read_text(encoding="utf-8")) for p in sorted(traces.glob("*.json"))]
        if not runs:
            raise MirrorSDError(f"no traces in {traces}")
        captured = bench_stages(traces.parent / "stage_ms.csv")
        profile = dict(profile, stages={**profile["stages"], **captured})
        step_ms, phase_ms = fit_host(runs, Profile.from_json(profile, "gpu-check profile"))
        host = dict(profile, name=f"{profile['name']}-host", step_ms=round(step_ms, 4), phase_ms=round(phase_ms, 4),
                    source=profile["source"].replace(NOT_MEASURED, "")
                    + (f"{', '.join(captured)}: from the replays of the graphs-on bench's stages (stage_ms.csv; "
                       f"gpu_check.bench_stages). " if captured else "")
                    + f"step_ms and phase_ms: the host's time per step and per phase, fitted on the {len(runs)} "
                      f"traces of gpu-check's graphs-on bench (whatif.fit_host); rendezvous_ms and channel_ms: 0.")
        fitted = Profile.from_json(host, "gpu-check host profile")
        path = out / f"profile-{host['name']}.json"
        path.write_text(json.dumps(host, indent=1), encoding="utf-8")
        per_run = pd.DataFrame([dict(method=t.method, measured_s=measured_seconds(t),
                                     modelled_s=modelled_seconds(t, fitted)) for t in runs])
        table = per_run.groupby("method", sort=False).agg(
            runs=("method", "size"), measured_s=("measured_s", "sum"), modelled_s=("modelled_s", "sum"),
        ).reset_index().to_dict("records")
        part.update(ok=True, outcome=f"wrote {path.name}: step_ms {step_ms:.3f}, phase_ms {phase_ms:.3f}",
                    host_table=table)
    except Exception as e:  # noqa: BLE001  (reported; the other parts still run)
        part.update(outcome=f"{type(e).__name__}: {e}")
    part["wall_s"] = time.monotonic() - start
    return part


DRAFT_LABEL = re.compile(r"(tree|stream) draft (\d+)x(\d+), (\d+) kept")  # EAGLE's and ss's one-stage drafts


def bench_stages(stage_ms: Path) -> dict:
    """Profile costs (whatif.STAGES) of the stages a bench captured beyond the forwards the stage
    part times, from their replays (``stage_ms.csv``): ``target_tree``, the target's forward over a
    tree under its mask, by width; ``eagle_level``, a level of EAGLE's tree draft after the first
    (the one-stage tree draft's replay less the head's forward over the same pairs, over its depth − 1
    levels; the median over the widths, at the frontier's width); and ``stream_draft``, the streams'
    one-stage draft by its levels. A draft that ran at more than one shape, or not at all, is left out."""
    if not stage_ms.exists():
        return {}
    rows = pd.read_csv(stage_ms)
    out = {}
    tree = rows[(rows.model == "target") & (rows.stage == "tree verify")]
    if len(tree):
        out["target_tree"] = {"ms_by_width": {str(w): round(float(ms), 4) for w, ms in zip(tree.width, tree.ms)}}
    streams = _one_draft(rows, "target", "stream")
    if streams is not None:
        replays, levels, _ = streams
        out["stream_draft"] = {"ms_by_width": {str(levels): round(float(replays.median()), 4)}}
    eagle = _one_draft(rows, "EagleHead", "tree")
    head = rows[(rows.model == "EagleHead") & (rows.stage == "pairs")].set_index("width").ms
    if eagle is not None and eagle[1] > 1:
        replays, levels, frontier = eagle
        per_level = [(ms - head[w]) / (levels - 1) for w, ms in replays.items() if w in head.index]
        if per_level:
            level_ms = max(0.0, float(statistics.median(per_level)))
            out["eagle_level"] = {"ms_by_width": {str(frontier): round(level_ms, 4)}}
    return out


def _one_draft(rows: pd.DataFrame, model: str, kind: str):
    """(replay ms by width, levels, nodes per level) of the one draft stage of ``kind`` ("tree" or
    "stream") that ``model`` ran, or None where it ran none or several shapes."""
    mine = rows[(rows.model == model) & rows.stage.str.fullmatch(DRAFT_LABEL) & rows.stage.str.startswith(kind)]
    if mine.stage.nunique() != 1:
        return None
    levels, per_level = (int(g) for g in DRAFT_LABEL.fullmatch(mine.stage.iloc[0]).groups()[1:3])
    return mine.set_index("width").ms, levels, per_level


def host_fit_section(part: dict) -> list[str]:
    """The host-fit part's table: how the profile with the host's time re-times the graphs-on bench."""
    if not part.get("host_table"):
        return []
    lines = ["", "## The stage replays plus the host's time, against the graphs-on bench (a model's check)", "",
             f"{part['outcome'].removeprefix('wrote ')}. Each run re-timed on that profile (`python -m mirror_sd "
             "whatif`), summed per method; fitted on these very runs, so a check of the model's shape, not a "
             "held-out test.", "", "| method | runs | measured s | modelled s | error |", "|---|---|---|---|---|"]
    for row in part["host_table"]:
        error = row["modelled_s"] / row["measured_s"] - 1 if row["measured_s"] else float("nan")
        lines.append(f"| {row['method']} | {row['runs']} | {row['measured_s']:.3f} | {row['modelled_s']:.3f} | "
                     f"{error:+.1%} |")
    return lines


def _text(b) -> str:
    return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")


def _stage_part(out: Path, deadline: float) -> dict:
    part = dict(name="stages", command="in process: models/stages.py on the embedded pair", ok=False)
    if deadline - time.monotonic() < LEAST_S:
        return dict(part, outcome=SKIPPED, wall_s=0.0)
    print("gpu-check: stage replays ...", flush=True)
    start = time.monotonic()
    try:
        profile, table, diagnosis = stage_profile()
        path = out / f"profile-{profile['name']}.json"
        path.write_text(json.dumps(profile, indent=1), encoding="utf-8")
        agree = "DIFFERENT" not in profile["notes"]  # graphs_agree: graphs commit the plain forward's tokens
        part.update(ok=agree, outcome=f"wrote {path.name}", table=table, profile=profile, diagnosis=diagnosis,
                    tuned=tuning.plan_table())
    except Exception as e:  # noqa: BLE001  (reported; the benches still run)
        part.update(outcome=f"{type(e).__name__}: {e}")
    part["wall_s"] = time.monotonic() - start
    return part


# -- stage replays, timed on the GPU ---------------------------------------------------------------
def replay_ms(stage, repeats: int = REPLAYS) -> float:
    """Median GPU milliseconds of one replay of a captured stage (its buffers hold padding)."""
    return stage.time_replays(repeats)


def side_by_side_ms(target_stage, draft_stage, draft_stream, draft_runs: int = 4) -> tuple[float, float]:
    """(one after the other, side by side) GPU ms of a target replay and ``draft_runs`` draft
    replays, the draft's on ``draft_stream``: how much of the shorter work the GPU hides."""
    current = torch.cuda.current_stream()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    serial, parallel = [], []
    for _ in range(REPLAYS):
        begin.record()
        target_stage.replay()
        for _ in range(draft_runs):
            draft_stage.replay()
        end.record()
        end.synchronize()
        serial.append(begin.elapsed_time(end))
        begin.record()
        draft_stream.wait_stream(current)
        with torch.cuda.stream(draft_stream):
            for _ in range(draft_runs):
                draft_stage.replay()
        target_stage.replay()
        current.wait_stream(draft_stream)
        end.record()
        end.synchronize()
        parallel.append(begin.elapsed_time(end))
    return statistics.median(serial), statistics.median(parallel)


def stage_profile(pair=None, timer=None) -> tuple[dict, list[dict], dict]:
    """Capture every stage of the embedded pair (or ``pair``) on this GPU, time one replay of each
    (``timer``: ``replay_ms``), and return a hardware profile (whatif.Profile's JSON), the table of
    times and what explains the target's times by width (:func:`width_diagnosis`). On the CPU (the
    tests' rehearsal, with a host timer) the stages run eagerly."""
    from .. import load_pair
    from ..methods.mirror import default_exit_layer
    from ..models.stages import Stages

    pair, timer = pair or load_pair(), timer or replay_ms
    target, draft = pair.target, pair.draft
    exit_layer = default_exit_layer(target.num_layers)
    with torch.inference_mode():
        t = Stages(target, CACHE_SLOTS)
        t.add("prefix", (0, exit_layer), head=False)
        t.add("suffix", (exit_layer, target.num_layers), head=True)
        d = Stages(draft, CACHE_SLOTS, stream=pair.draft_lane.stream)
        ms = {}
        for stage, (stages, name) in {"target": (t, "full"), "target_prefix": (t, "prefix"),
                                      "target_suffix": (t, "suffix"), "draft": (d, "full"),
                                      **_method_stages(pair, t, exit_layer)}.items():
            with _on_stream(stages.model.device, pair.draft_lane.stream if stages is d else None):
                ms[stage] = {w: timer(stages.stage(name, w)) for w in BUCKETS}
        exit_ms = ms.pop("early_exit")
        overlap, serial, parallel = 1.0, None, None
        if draft.device == target.device and pair.draft_lane.stream is not None:  # one GPU, two streams
            serial, parallel = side_by_side_ms(t.stage("full", 8), d.stage("full", 1), pair.draft_lane.stream)
            shorter = min(ms["target"][8], 4 * ms["draft"][1])
            overlap = max(0.0, min(1.0, (serial - parallel) / shorter)) if shorter > 0 else 0.0
        plain = _plain_forward_ms(target)
        agree = graphs_agree(t, target)
        diagnosis = width_diagnosis(t, timer)
    gpu = hardware_name(target.device)
    name = re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-") + "-graphs"
    profile = dict(
        name=name,
        source=(f"Measured by python -m mirror_sd gpu-check on {gpu}, {datetime.now(timezone.utc):%Y-%m-%d}: "
                f"CUDA-graph replays of the fixed-shape stages (mirror_sd/models/stages.py) of the embedded pair, "
                f"{target.dtype}, median of {REPLAYS}, CUDA events, caches of {CACHE_SLOTS} slots. "
                f"target_prefix: layers [0, {exit_layer}) and the early exit (two stages); target_suffix: layers "
                f"[{exit_layer}, {target.num_layers}) and the LM head; "
                f"{'eagle_head: the head forward over pairs (not its logits); ' if 'eagle_head' in ms else ''}"
                f"{'streams: the stream rows through the top layers and the streams head. ' if 'streams' in ms else ''}"
                + (f"overlap from a width-8 target replay beside 4 one-token draft replays on the draft lane's "
                   f"stream: {serial:.3f} ms one after the other, {parallel:.3f} ms side by side. "
                   if serial is not None else "overlap 1: the draft has a GPU of its own (assumed, not measured). ")
                + NOT_MEASURED),
        notes=f"{gpu}, CUDA graphs, {target.dtype}; draft lane {pair.draft_lane.label}.",
        devices=dict(target=f"{gpu} (CUDA graphs)", draft=pair.draft_lane.label),
        rendezvous_ms=0.0, channel_ms=0.0, overlap=round(overlap, 3), draft_speed=1.0, step_ms=0.0, buckets=True,
        split=dict(exit_layer=exit_layer, layers=target.num_layers),
        stages={s: {"ms_by_width": {str(w): round(v + (exit_ms[w] if s == "target_prefix" else 0.0), 4)
                                    for w, v in by_width.items()}} for s, by_width in ms.items()},
    )
    Profile.from_json(profile, "gpu-check profile")  # the format whatif reads, checked before it is written
    profile["notes"] += f" Graphs against the plain forward: {agree}."
    table = [dict(width=w, **{s: ms[s][w] for s in ms}, early_exit=exit_ms[w], plain=plain[w]) for w in BUCKETS]
    return profile, table, diagnosis


def width_diagnosis(t, timer) -> dict:
    """Why the target's time grows with the width (mirror_sd/tools/kernels.py): its top kernels at a few
    widths and its full forward under other number formats; a failure is reported in place."""
    out = {}
    for key, measure in (("kernels", lambda: kernel_table(t)),
                         ("formats", lambda: format_times(t.model, CACHE_SLOTS, timer))):
        try:
            out[key] = measure()
        except Exception as e:  # noqa: BLE001  (a diagnosis must not cost the profile)
            out[key] = f"{type(e).__name__}: {e}"
    return out


def _method_stages(pair, t, exit_layer: int) -> dict:
    """stage -> (stage set, name) of the other stages the methods replay, where the pair has what they
    need: Mirror-SD's early exit (its default reader) and the streams' pass, on the target's set
    ``t``, and the EAGLE head's forward over pairs, on a set of its own."""
    from ..methods.mirror import exit_reader
    from ..models.eagle import HeadStages, head_for
    from ..models.exit_head import available_exit_head
    from ..models.forwards import name_range
    from ..models.streams import target_streams

    reader = exit_reader(pair, available_exit_head(pair, exit_layer))
    stages = {"early_exit": (t, name_range(t, (exit_layer, exit_layer, reader)))}
    try:
        streams = target_streams(pair)
        stages["streams"] = (t, name_range(t, (streams.first_layer, None, streams)))
    except MirrorSDError:  # no streams for this target
        pass
    try:
        head = head_for(pair)
        stages["eagle_head"] = (HeadStages(head, CACHE_SLOTS), HeadStages.name(None))
    except MirrorSDError:  # no EAGLE head for this target
        pass
    return stages


@contextmanager
def _on_stream(device: torch.device, stream=None):
    """``device`` and ``stream`` (None: the device's current stream) current while inside; nothing
    to set on the CPU."""
    if device.type != "cuda":
        yield
        return
    with torch.cuda.device(device), torch.cuda.stream(stream or torch.cuda.current_stream(device)):
        yield


def graphs_agree(stages, model, tokens: int = 32) -> str:
    """The target's graphs against its plain forward on one prompt: the largest logit difference of
    the prefill, and whether greedy decoding commits the same tokens."""
    prompt = ((torch.arange(12, device=model.device) * 37 + 11) % model.args.vocab_size)[None]  # [1, 12]
    plain = model.new_cache(CACHE_SLOTS)
    runs = [_greedy(lambda ids: model.forward(ids, plain, commit=False), plain, prompt, tokens),
            _greedy(lambda ids: stages.run("full", ids), stages.cache, prompt, tokens)]
    diff = (runs[0][0] - runs[1][0]).abs().max().item()
    same = "the same" if runs[0][1] == runs[1][1] else "DIFFERENT"
    return f"prefill logits within {diff:.2e}, {same} {tokens} greedy tokens"


def _greedy(step, cache, prompt, tokens: int):
    """(prefill logits, greedy tokens): step(ids) -> logits of ids written at cache.length."""
    cache.rollback(0)
    prefill = logits = step(prompt)
    cache.length, out = prompt.shape[1], []
    for _ in range(tokens):
        out.append(int(logits[0, -1].argmax()))
        logits = step(torch.tensor([[out[-1]]], device=prompt.device))
        cache.length += 1
    return prefill, out


def _plain_forward_ms(model, repeats: int = 5) -> dict[int, float]:
    """Width -> host wall ms of one plain (eager) target forward over that many tokens: what a step
    costs today, launches included."""
    cache = model.new_cache(CACHE_SLOTS)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    times = {}
    for width in BUCKETS:
        ids = torch.zeros(1, width, dtype=torch.long, device=model.device)
        runs = []
        for _ in range(repeats + 1):  # the first run warms up
            sync()
            start = time.perf_counter()
            model.forward(ids, cache, commit=False)
            sync()
            runs.append(1e3 * (time.perf_counter() - start))
        times[width] = statistics.median(runs[1:])
    return times


# -- the report -------------------------------------------------------------------------------------
def write_report(out: Path, parts: list[dict], gpu: str, budget_s: float) -> Path:
    """``out/report.md`` for the parts run so far (written again after each part)."""
    path = out / "report.md"
    path.write_text(report(parts, out, gpu, budget_s), encoding="utf-8")
    return path


def report(parts: list[dict], out: Path, gpu: str, budget_s: float) -> str:
    """The report's markdown: the machine, each part's outcome, the stage table, the bench tables and
    the graphs-on bench's step costs, from the parts run so far and what they wrote into ``out``."""
    lines = [f"# gpu-check: {gpu}", "",
             f"`python -m mirror_sd gpu-check --out {out} --budget {budget_s:g}`, "
             f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC; torch {torch.__version__}, CUDA {torch.version.cuda}, "
             f"{torch.cuda.device_count()} GPU(s).", "",
             "| part | outcome | wall s | command |", "|---|---|---|---|"]
    for p in parts:
        outcome = SKIPPED if p["outcome"] == SKIPPED else ("passed" if p["ok"] else "FAILED") + f": {p['outcome']}"
        lines.append(f"| {p['name']} | {outcome.replace('|', '/')} | {p['wall_s']:.0f} | `{p['command']}` |")
    stages = next((p for p in parts if p["name"] == "stages"), {})
    if stages.get("table"):
        columns = {"target": "target", "target_prefix": "target prefix", "early_exit": "early exit",
                   "target_suffix": "target suffix", "draft": "draft", "streams": "streams", "eagle_head": "EAGLE head",
                   "plain": "plain target forward (host wall ms)"}
        columns = {k: v for k, v in columns.items() if k in stages["table"][0]}
        lines += ["", "## One CUDA-graph replay per stage (GPU ms, median; CUDA events)", "",
                  "| width | " + " | ".join(columns.values()) + " |", "|---" * (len(columns) + 1) + "|"]
        for row in stages["table"]:
            lines.append(f"| {row['width']} | " + " | ".join(_ms(row[k]) for k in columns) + " |")
        lines += ["", stages["profile"]["notes"], "",
                  f"overlap (draft on the second stream): {stages['profile']['overlap']}. "
                      f"Profile: `{stages['outcome'].removeprefix('wrote ')}` "
                      f"(`python -m mirror_sd whatif --profile {out}/{stages['outcome'].removeprefix('wrote ')} ...`).",
                  "", "Windows that run at a wider, cheaper bucket (models/stages.py routes them by these times): "
                      + "; ".join(f"{columns[k]}: {_routes({row['width']: row[k] for row in stages['table']})}"
                                  for k in columns if k != "plain") + "."]
        lines += tuning_section(stages.get("tuned", []))
        lines += diagnosis_section(stages.get("diagnosis", {}))
    for name, title in BENCH_TITLES.items():
        summary = out / name / "summary.md"
        if summary.exists():
            lines += ["", f"## {name}: {title}", "", summary.read_text(encoding="utf-8").strip()]
    lines += goals_section(out / "bench-graphs-on" / "summary.csv", gpu)
    lines += host_fit_section(next((p for p in parts if p["name"] == "host-fit"), {}))
    lines += step_cost_section(out / "bench-graphs-on" / "traces")
    lines += stage_replay_section(out / "bench-graphs-on" / "stage_ms.csv")
    lines += launch_section(out / "bench-graphs-on" / "stage_ms.csv")
    lines += refused_section(out)
    lines += ["", "Spans on CUDA lanes come from CUDA events. On CUDA lanes Mirror-SD's steps are queued on the "
                  "two streams (the draft stream waits for the token channel on a CUDA event; "
                  "mirror_sd/executors.py: Streams)."]
    return "\n".join(lines) + "\n"


def _routes(ms_by_width: dict[int, float]) -> str:
    """'5-16 at 32, 33-48 at 64': the widths the stages route past their smallest bucket (``routed_widths``)."""
    runs = []  # [first, last, bucket]
    for w, to in routed_widths(ms_by_width).items():
        if runs and runs[-1][1] == w - 1 and runs[-1][2] == to:
            runs[-1][1] = w
        else:
            runs.append([w, w, to])
    return ", ".join(f"{a}-{b} at {to}" if a < b else f"{a} at {to}" for a, b, to in runs) or "none"


def tuning_section(rows: list[dict]) -> list[str]:
    """Report lines: each fp32 operation the stages captured in a tuned formulation, by op, shape and
    rows, with every formulation's GPU time and the one chosen (models/tuning.py); why one was left
    out, once per formulation."""
    lines = []
    for op, title in (("product", "Matrix products (weight N x K)"), ("attention", "Attention"), ("norm", "RMSNorm"),
                      ("added_norm", "Residual add and RMSNorm"), ("rotary", "Rotary embedding"),
                      ("rotary_store", "Rotary embedding and cache writes"), ("projections", "q, k and v products"),
                      ("gated", "The MLP's silu(gate) * up")):
        names = tuning.FORMULATIONS[op]
        kept = [r for r in rows if r["op"] == op and r["dtype"] == "float32" and not r["tf32"]]
        if not kept:
            continue
        lines += ["", f"## {title} by rows, tuned (GPU us per run in a CUDA graph; the stages record the chosen "
                      f"one: models/tuning.py)", "",
                  "| shape | rows | chosen | " + " | ".join(names) + " |", "|---" * (len(names) + 3) + "|"]
        failed = {}
        for r in kept:
            cells = []
            for name in names:
                if isinstance(r[name], str):
                    failed.setdefault(name, r[name])
                    cells.append("-")
                else:
                    cells.append(f"**{r[name]:.1f}**" if name == r["chosen"] else f"{r[name]:.1f}")
            lines.append(f"| {r['shape']} | {r['rows']} | {r['chosen']} | " + " | ".join(cells) + " |")
        lines += [""] + [f"{name} left out: {why.replace('|', '/')}" for name, why in failed.items()]
    return lines


def diagnosis_section(diagnosis: dict) -> list[str]:
    """Report lines: the target's top kernels by width and its times under other number formats."""
    def kernel_table(kernels) -> list[str]:
        widths = " | ".join(f"width {w}" for w in PROFILED_WIDTHS)
        lines = [f"| kernel | calls | {widths} |", "|---|---" + "|---" * len(PROFILED_WIDTHS) + "|"]
        for row in kernels:
            name = row["kernel"].replace("|", "/")
            name = f"**{name}**" if name == EVERY else f"`{name if len(name) <= 90 else name[:87] + '...'}`"
            lines.append(f"| {name} | {row['calls']:g} | "
                         + " | ".join(_us(row[f"us_w{w}"]) for w in PROFILED_WIDTHS) + " |")
        return lines

    def format_table(formats) -> list[str]:
        return (["| width | " + " | ".join(formats) + " |", "|---" * (len(formats) + 1) + "|"]
                + [f"| {w} | " + " | ".join(_ms(times[w]) for times in formats.values()) + " |" for w in BUCKETS])

    return (_part(diagnosis.get("kernels"), "## The target's top kernels by width (torch.profiler, one eager forward "
                  "in the kernels its graph records; us per forward; first, every kernel together)", kernel_table)
            + _part(diagnosis.get("formats"), "## The target's full forward under other number formats (ms per "
                    "replay; the engine runs fp32 without TF32)", format_table))


def _part(value, heading: str, table) -> list[str]:
    """A report part: nothing if ``value`` is None; else its heading, then ``value`` as it is where it
    says why it was not measured (a string), or ``table(value)``."""
    if value is None:
        return []
    return ["", heading, ""] + ([value] if isinstance(value, str) else table(value))


def _us(x) -> str:
    return "" if x is None else f"{x:.1f}"


def stage_replay_section(path: Path) -> list[str]:
    """Report lines: the GPU ms of one replay of every stage the graphs-on bench captured (its
    stage_ms.csv: the one-stage drafts and verifications beside the forwards), by width; none
    when the file is missing."""
    if not path.exists():
        return []
    table = pd.read_csv(path).pivot_table(index=["model", "stage"], columns="width", values="ms", sort=False)
    return ["", "## Stage replays in the graphs-on bench (GPU ms, CUDA events at capture; `stage_ms.csv`)", "",
            table.to_markdown(floatfmt=".3f")]


def launch_section(path: Path) -> list[str]:
    """Report lines: what launching each stage the graphs-on bench captured costs, at its narrowest
    width (``stage_ms.csv``'s launch columns, ``Stage.time_launch``): the host's ms in the launch,
    and the GPU's ms from an idle stream to the replay's end against the replay alone; none when
    the file or its launch times are missing."""
    if not path.exists():
        return []
    table = pd.read_csv(path)
    if "from_idle_ms" not in table or table.from_idle_ms.isna().all():
        return []
    first = table.dropna(subset=["from_idle_ms"]).sort_values("width").groupby(["model", "stage"], sort=False).head(1)
    rows = pd.DataFrame({"model": first.model, "stage": first.stage, "width": first.width,
                         "replay ms": first.ms, "host ms to launch": first.launch_ms,
                         "GPU ms from idle": first.from_idle_ms,
                         "waiting for the launch": first.from_idle_ms - first.ms})
    return ["", "## Launching a stage (at its narrowest width; `stage_ms.csv`)", "",
            "Each launch on an idle stream: the host's time in the launch, and the GPU's from an event recorded "
            "just before it to the replay's end. The last column is what the GPU waited for the launch to reach it, "
            "which a step's spans carry beyond their replays.", "",
            rows.to_markdown(index=False, floatfmt=".3f")]


REFUSED = re.compile(r"stage '([^']+)' could not be captured as a CUDA graph \((.*?)\); its method runs", re.DOTALL)


GOAL_VANILLA_TOKENS_S = 250  # issue 32: vanilla in fp32 on CUDA graphs, on an H100
GOAL_OVERLAP = 0.8  # issue 32: Mirror-SD's draft work under the target's, on one GPU


def goals_section(summary: Path, gpu: str) -> list[str]:
    """Report lines: issue 32's goals against the graphs-on bench's summary (``summary.csv``, at
    the default settings), each measured and met or not; none without the summary."""
    if not summary.exists():
        return []
    return ["", f"## Issue 32's goals, at the default settings (bench-graphs-on; asked of an H100, run on {gpu})",
            "", *goals_table(pd.read_csv(summary).set_index("method")),
            "", "At other settings: the sweeps (`python -m scripts.gpu_bundle` prints their call; "
            "`python -m scripts.best_settings` tables the goals at each method's best)."]


def times(speedup: float) -> str:
    """A speedup as 1.23×; with a third decimal where two would read as 1.00× (is it faster or not?)."""
    return f"{speedup:.3f}×" if round(speedup, 2) == 1 else f"{speedup:.2f}×"


def goals_table(rows: pd.DataFrame) -> list[str]:
    """Markdown lines: issue 32's goals, each measured and met or not, from one row per method
    (index: method; columns speedup, tokens_per_s, overlap, equal_to_vanilla)."""
    speed, rows_of = rows["speedup"], rows.index
    speculative = [m for m in ("sd", "eagle", "ss", "mirror") if m in rows_of]
    goals = [(f"vanilla ≥ {GOAL_VANILLA_TOKENS_S} tokens/s", f"{rows.loc['vanilla', 'tokens_per_s']:.0f} tokens/s",
              rows.loc["vanilla", "tokens_per_s"] >= GOAL_VANILLA_TOKENS_S)]
    goals += [(f"`{m}` faster than vanilla", times(speed[m]), speed[m] > 1) for m in speculative]
    if {"mirror", "eagle"} <= set(rows_of):
        goals.append(("`mirror` at least level with `eagle`",
                      f"{times(speed['mirror'])} against {times(speed['eagle'])}", speed["mirror"] >= speed["eagle"]))
        goals.append((f"`mirror`'s overlap ≥ {GOAL_OVERLAP}", f"{rows.loc['mirror', 'overlap']:.2f}",
                      rows.loc["mirror", "overlap"] >= GOAL_OVERLAP))
    goals.append(("every method commits vanilla's tokens", f"{rows['equal_to_vanilla'].min():.0%} of runs at worst",
                  rows["equal_to_vanilla"].min() == 1))
    return ["| goal | measured | met |", "|---|---|---|",
            *(f"| {goal} | {measured} | {'yes' if met else 'no'} |" for goal, measured, met in goals)]


def refused_section(out: Path) -> list[str]:
    """Report lines: every one-stage forward a part refused to capture (its log's warning; the
    method ran that work an operation at a time, so its speed is not the graphs'), with why; none
    when every capture held."""
    rows = [(log.stem, stage, " ".join(why.split())[:160]) for log in sorted(out.glob("*.log"))
            for stage, why in dict(REFUSED.findall(log.read_text(encoding="utf-8", errors="replace"))).items()]
    if not rows:
        return []
    return ["", "## Captures refused (that work ran an operation at a time; models/capture_check.py)", "",
            "| part | stage | why |", "|---|---|---|", *(f"| {p} | {s} | {w.replace('|', '/')} |" for p, s, w in rows)]


def step_cost_section(traces: Path) -> list[str]:
    """Report lines: what each kind of step cost in the graphs-on bench (``trace.step_cost_table``:
    Mirror-SD's steps by window and outcome), or none when its traces are missing."""
    files = sorted(traces.glob("*.json")) if traces.is_dir() else []
    if not files:
        return []
    table = step_cost_table(Trace.from_json(f.read_text(encoding="utf-8")) for f in files)
    return ["", "## Step costs, graphs on (`python -m scripts.step_costs` over the bench's traces)", "",
            table.to_markdown(floatfmt=("", "d", ".2f", ".2f", ".2f", ".2f", ".2f"))]


def _ms(x) -> str:
    return "" if x is None else f"{x:.3f}"
