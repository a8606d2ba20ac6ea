"""gpu-check (mirror_sd/tools/gpu_check.py) on the CPU: its answer without CUDA, and a rehearsal of its
parts, budget and report, so that a session lent a GPU spends none of its short time on them."""
from __future__ import annotations

import functools
import json
import time

import pandas as pd
import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.models import tuning
from mirror_sd.models.eagle import EagleHead, attach_head
from mirror_sd.models.stages import Stages
from mirror_sd.tools import gpu_check
from mirror_sd.tools.whatif import Profile, fit_host
from mirror_sd.trace import Trace

from test_ss import random_streams


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without CUDA")
def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_2(capsys):
    from mirror_sd.cli import main

    assert main(["gpu-check", "--out", "unused"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and len(captured.err.strip().splitlines()) == 1 and "CUDA" in captured.err


def test_gpu_checks_agreement_of_stages_and_plain_forward_on_the_cpu_too(tiny_pair):
    target = tiny_pair.target
    with torch.inference_mode():
        agree = gpu_check.graphs_agree(Stages(target, gpu_check.CACHE_SLOTS), target, tokens=8)
    assert agree.endswith("the same 8 greedy tokens")


@pytest.mark.skipif(torch.cuda.is_available(), reason="rehearses on a machine without CUDA")
def test_a_rehearsal_writes_the_report_after_every_part_and_skips_what_the_budget_leaves_no_room_for(
        tmp_path, monkeypatch, tiny_dirs):
    """Every part really runs on the CPU, as a stand-in GPU, on the tiny pair: the stage replays
    (eager, timed by the host), the graphs-on bench (with graphs off, to get its traces), the bench
    at the smallest buckets (eager stages), the tests part (made to fail), and the last bench finds
    the budget spent. The report shows each outcome,
    the stage table and the bench's tables."""
    def host_ms(stage):
        start = time.perf_counter()
        stage.replay()
        return 1e3 * (time.perf_counter() - start)

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))  # with every method's add-on
    torch.manual_seed(0)
    attach_head(pair, EagleHead.from_target(pair.target, torch.arange(16)))
    pair.streams = random_streams(pair.target, layers=1, G=3)
    monkeypatch.setattr(gpu_check, "stage_profile", functools.partial(gpu_check.stage_profile, pair, host_ms))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Rehearsal GPU")
    monkeypatch.setattr(gpu_check, "BENCH", ["--methods", "vanilla,mirror", "--limit", "2", "--max-new-tokens", "6",
                                             "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])])
    monkeypatch.setattr(gpu_check, "TESTS", ["tests/no_such_test.py"])
    kind = ("product", "cuda:0", "1536 x 576", 8, "float32", False)  # as a GPU's stages would have tuned it
    monkeypatch.setattr(tuning, "PLAN", {kind: "skinny"})
    monkeypatch.setattr(tuning, "TIMES", {kind: {"cublas": 52.5, "swapped": 30.0, "skinny": 4.0, "skinny-wide": 6.0,
                                                    "matvec": 5.0, "matvec-wide": "ValueError: too wide"}})
    monkeypatch.setattr(gpu_check, "BENCHES", [
        ("bench-graphs-on", ["--graphs", "off", "--traces", "{out}/traces"], 150),
        ("bench-smallest-bucket", ["--graphs", "on", "--buckets", "smallest"], 150),
        ("bench-graphs-off", ["--graphs", "off"], 150)])
    reports = []
    write = gpu_check.write_report
    monkeypatch.setattr(gpu_check, "write_report", lambda *a: reports.append(write(*a).read_text()))
    run, spent = gpu_check._run, []

    def run_then_spend_the_budget(out, name, command, deadline, limit):
        part = run(out, name, command, 0.0 if spent else deadline, limit)
        spent.extend([True] if name == "tests" else [])  # the part after the tests finds no time left
        return part

    monkeypatch.setattr(gpu_check, "_run", run_then_spend_the_budget)

    assert gpu_check.gpu_check(tmp_path, budget_s=400) == 1  # some parts failed
    assert len(reports) == 6  # after each part
    report = (tmp_path / "report.md").read_text()
    assert report == reports[-1] and report.startswith("# gpu-check: Rehearsal GPU")
    assert "--budget 400" in report
    rows = {line.split(" | ")[0].strip("| "): line for line in report.splitlines() if line.startswith("| ")}
    assert "passed: wrote profile-" in rows["stages"]
    assert "## One CUDA-graph replay per stage" in report and "the same 32 greedy tokens" in report
    (profile,) = tmp_path.glob("profile-*-graphs.json")
    assert {"target", "target_prefix", "target_suffix", "draft", "streams", "eagle_head"} <= set(
        Profile.from_json(json.loads(profile.read_text()), "rehearsal").stages)  # what whatif reads
    assert "| width | target | target prefix | early exit | target suffix | draft | streams | EAGLE head |" in report
    assert "Windows that run at a wider, cheaper bucket" in report and "target: " in report
    kernels = report.split("## The target's top kernels by width")[1].split("##")[0]
    assert "| kernel | calls | width 1 | width 8 | width 32 |" in kernels
    assert "`aten::" in kernels  # on the CPU the profiler names operators (on a GPU, kernels)
    every = next(line for line in kernels.splitlines() if line.startswith("| **every kernel** |"))
    assert float(every.split(" | ")[1]) > 5 * pair.target.num_layers  # how many a forward runs: several a layer
    formats = report.split("## The target's full forward under other number formats")[1].split("##")[0]
    assert "| width | fp32, TF32 products |" in formats and "bf16" not in formats  # bf16 on a GPU only
    assert len([line for line in formats.splitlines() if line.startswith("| ") and line[2].isdigit()]) == 7
    assert "| 1536 x 576 | 8 | skinny | 52.5 | 30.0 | **4.0** | 6.0 | 5.0 | - |" in report  # models/tuning.py's choices
    assert "matvec-wide left out: ValueError: too wide" in report
    assert "passed: exit 0" in rows["bench-graphs-on"] and "passed: exit 0" in rows["bench-smallest-bucket"]
    assert "FAILED: exit" in rows["tests"] and (tmp_path / "tests.log").exists()
    assert "| skipped: the time budget ran out |" in rows["bench-graphs-off"]
    assert "## bench-graphs-on" in report and "| mirror " in report  # the bench's own table
    assert "## Step costs, graphs on" in report  # from the bench's traces
    assert "passed: wrote profile-" in rows["host-fit"] and "-graphs-host.json: step_ms" in rows["host-fit"]
    (host,) = tmp_path.glob("profile-*-graphs-host.json")  # the stage profile with the host's time fitted
    host = Profile.from_json(json.loads(host.read_text()), "host")
    traces = list((tmp_path / "bench-graphs-on" / "traces").glob("*.json"))  # one per turn
    assert host.buckets and f"fitted on the {len(traces)} traces" in host.source
    (stage,) = tmp_path.glob("profile-*-graphs.json")  # the replays alone, which the fit starts from
    stage = Profile.from_json(json.loads(stage.read_text()), "stages")
    fitted = fit_host([Trace.from_json(t.read_text()) for t in traces], stage)  # timing decides the values, not >0
    assert (host.step_ms, host.phase_ms) == pytest.approx(fitted, abs=1e-3) and min(fitted) >= 0
    fit = report.split("## The stage replays plus the host's time")[1].split("##")[0]
    for method in ("vanilla", "mirror"):  # each method's runs re-timed
        assert f"| {method} | {sum(t.name.startswith(method) for t in traces)} |" in fit
    assert "bench-graphs-on" not in reports[0] and "| stages |" in reports[0]  # the first report: one part


def test_the_report_tables_the_graphs_on_benchs_stage_replays(tmp_path):
    """stage_ms.csv (bench.stage_replay_ms) as a table: a row per model and stage, a column per width."""
    path = tmp_path / "stage_ms.csv"
    assert gpu_check.stage_replay_section(path) == []  # no file, no section
    pd.DataFrame([dict(model="target", stage="full", width=1, ms=0.97), dict(model="target", stage="full", width=8,
                                                                             ms=1.34),
                  dict(model="draft", stage="rollouts 12x2 from 9x4 candidates", width=16, ms=0.41)]).to_csv(path)
    lines = gpu_check.stage_replay_section(path)
    table = "\n".join(lines)
    assert "Stage replays" in lines[1] and "rollouts 12x2 from 9x4 candidates" in table
    assert "0.970" in table and "1.340" in table and "0.410" in table


def test_the_host_profile_takes_the_benchs_tree_verify_and_one_stage_drafts(tmp_path):
    """bench_stages: target_tree from the tree verify's replays; eagle_level from the tree draft less
    the head's forward over the same pairs, per level after the first; stream_draft at its levels;
    nothing for a draft that ran at two shapes, nor without the file."""
    path = tmp_path / "stage_ms.csv"
    assert gpu_check.bench_stages(path) == {}
    rows = [dict(model="target", stage="tree verify", width=w, ms=ms) for w, ms in ((1, 1.0), (8, 1.4))]
    rows += [dict(model="EagleHead", stage="pairs", width=w, ms=ms) for w, ms in ((1, 0.1), (8, 0.12), (16, 0.2))]
    rows += [dict(model="EagleHead", stage="tree draft 3x4, 8 kept", width=w, ms=ms) for w, ms in ((1, 0.5), (8, 0.6))]
    rows += [dict(model="target", stage="stream draft 4x2, 4 kept", width=4, ms=0.67),
             dict(model="draft", stage="chain draft of 2", width=1, ms=0.38)]
    pd.DataFrame(rows).to_csv(path, index=False)
    costs = gpu_check.bench_stages(path)
    assert costs == {"target_tree": {"ms_by_width": {"1": 1.0, "8": 1.4}},
                     "eagle_level": {"ms_by_width": {"4": pytest.approx((0.2 + 0.24) / 2)}},  # (0.4/2, 0.48/2)
                     "stream_draft": {"ms_by_width": {"4": 0.67}}}
    Profile.from_json({"name": "p", "source": "s", "stages": {"target": {"ms": 1}, **costs}})  # whatif reads them
    rows.append(dict(model="EagleHead", stage="tree draft 4x4, 8 kept", width=1, ms=0.7))  # a second shape
    pd.DataFrame(rows).to_csv(path, index=False)
    assert "eagle_level" not in gpu_check.bench_stages(path)


def test_the_report_tables_what_launching_each_stage_costs(tmp_path):
    """stage_ms.csv's launch columns (Stage.time_launch) at each stage's narrowest timed width, with
    the GPU's wait for the launch (from idle less the replay); none without launch times."""
    path = tmp_path / "stage_ms.csv"
    assert gpu_check.launch_section(path) == []  # no file, no section
    rows = [dict(model="target", stage="full", width=1, ms=0.94, launch_ms=0.021, from_idle_ms=1.22),
            dict(model="target", stage="full", width=8, ms=1.34, launch_ms=0.022, from_idle_ms=1.62),
            dict(model="draft", stage="chain draft of 2", width=2, ms=0.405, launch_ms=None, from_idle_ms=None),
            dict(model="draft", stage="chain draft of 2", width=4, ms=0.418, launch_ms=0.015, from_idle_ms=0.5)]
    pd.DataFrame(rows).to_csv(path, index=False)
    table = "\n".join(gpu_check.launch_section(path))
    assert "Launching a stage" in table
    assert "| target  | full             |       1 |       0.940 |               0.021 |              1.220 |" \
           "                    0.280 |" in table
    assert "1.620" not in table  # the full forward at its narrowest width only
    assert "|       4 |       0.418 |               0.015 |              0.500 |                    0.082 |" in table
    pd.DataFrame([{**row, "launch_ms": None, "from_idle_ms": None} for row in rows]).to_csv(path, index=False)
    assert gpu_check.launch_section(path) == []  # timed by an older engine: no launch times


def test_the_report_names_every_capture_a_part_refused():
    """The warning Stages.capture gives for a refused one-stage forward (as this H200 run's logs hold
    it, reason over several lines), one row per part and stage; none when every capture held."""
    from pathlib import Path

    logs = Path(__file__).parent.parent / "docs" / "gpu" / "h200-2026-11-26-stages"
    lines = gpu_check.refused_section(logs)
    rows = [line for line in lines if line.startswith("| bench-")]
    assert "Captures refused" in lines[1]
    assert any("| tree verify | AcceleratorError: CUDA error: operation failed due to a previous error during capture"
               in row for row in rows)
    assert any("| tree draft 3x4, 8 kept | RuntimeError: Cannot copy between CPU and CUDA tensors" in row for row in rows)
    assert len(rows) == len(set(rows))


def test_no_refused_capture_no_section(tmp_path):
    (tmp_path / "bench-graphs-on.log").write_text("capturing CUDA graphs (target lane): 100%|####| 7/7\n")
    assert gpu_check.refused_section(tmp_path) == []


def test_the_report_says_which_of_issue_32s_goals_the_graphs_on_bench_met(tmp_path):
    """On the fourth GPU session's graphs-on bench (an H200's summary.csv): every goal a row, measured
    and met or not; no summary, no section."""
    from pathlib import Path

    assert gpu_check.goals_section(tmp_path / "summary.csv", "GPU") == []
    summary = Path(__file__).parent.parent / "docs" / "gpu" / "h200-2026-11-26" / "bench-graphs-on" / "summary.csv"
    lines = gpu_check.goals_section(summary, "NVIDIA H200")
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in lines if line.startswith("| ")}
    assert "run on NVIDIA H200" in lines[1]
    assert rows["vanilla ≥ 250 tokens/s"] == "| vanilla ≥ 250 tokens/s | 234 tokens/s | no |"
    assert rows["`sd` faster than vanilla"].endswith("| 0.95× | no |")
    assert rows["`mirror` at least level with `eagle`"].endswith("| 0.83× against 0.92× | no |")
    assert rows["every method commits vanilla's tokens"].endswith("| yes |")
    assert len([r for r in rows if r.endswith("faster than vanilla")]) == 4 and "`mirror`'s overlap ≥ 0.8" in rows


def test_best_settings_tables_each_methods_fastest_measured_setting_and_the_goals_there():
    """scripts/best_settings.py on the sixth GPU session's folder (its bench and sweeps): each method's
    fastest setting, a sweep's noted with the folder's note, and the goals at those settings."""
    from pathlib import Path

    from scripts.best_settings import best_settings, goals_table

    best = best_settings(Path(__file__).parent.parent / "docs" / "gpu" / "h200-2026-11-27")
    assert list(best.index) == ["vanilla", "sd", "eagle", "ss", "mirror"]
    assert best.loc["vanilla", "setting"] == "defaults" and best.loc["vanilla", "speedup"] == 1
    assert best.loc["eagle", "setting"] == "total_tokens 16"
    assert best.loc["mirror", "setting"] == "branch_budget 4 (exit14)"
    assert round(best.loc["mirror", "speedup"], 3) == 1.045 and round(best.loc["eagle", "speedup"], 3) == 1.086
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in goals_table(best)}
    assert rows["`mirror` faster than vanilla"].endswith("| 1.05× | yes |")
    assert rows["`ss` faster than vanilla"].endswith("| 0.85× | no |")
    assert rows["`mirror` at least level with `eagle`"].endswith("| 1.05× against 1.09× | no |")


def test_best_settings_reads_the_options_a_sweep_fixed_from_its_csv():
    """The seventh GPU session's sweeps name their method and fixed options in sweep.csv (not in the
    folder's name): the best mirror setting carries them, and a speedup that two decimals would show
    as 1.00× gets a third."""
    from pathlib import Path

    from scripts.best_settings import best_settings, goals_table

    best = best_settings(Path(__file__).parent.parent / "docs" / "gpu" / "h200-2026-11-27-merged")
    assert best.loc["mirror", "setting"] == "branch_budget 4 (exit_layer 14, gamma 1)"
    assert best.loc["eagle", "setting"] == "total_tokens 7" and best.loc["ss", "setting"] == "gamma 1"
    rows = {line.split(" | ")[0].removeprefix("| "): line for line in goals_table(best)}
    assert rows["`ss` faster than vanilla"].endswith("| 1.003× | yes |")
    assert rows["`mirror` at least level with `eagle`"].endswith("| 1.05× against 1.14× | no |")
