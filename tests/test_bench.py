"""The bench command: vanilla first, equality checked, CSV + markdown summaries written."""
import json
import sys

import pandas as pd
import pytest

from mirror_sd import MirrorSDError
from mirror_sd.cli import main
from mirror_sd.tools.bench import read_prompts


def test_bench_writes_results_and_summary(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in [
        {"id": "a", "category": "qa", "prompt": "t1 t2 t3"},
        {"id": "b", "category": "math", "prompt": "t4 t5"},
        {"id": "c", "category": "multi-turn", "turns": ["t6 t7", "t8"]},
    ]))
    out = tmp_path / "out"
    rc = main(["bench", "--prompts", str(prompts), "--methods", "sd,mirror", "--max-new-tokens", "8", "--gamma", "3",
               "--out", str(out), "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])])
    assert rc == 0
    results = pd.read_csv(out / "results.csv")
    assert list(results.columns)[:19] == ["method", "id", "category", "task", "new_tokens", "steps", "accept_lengths",
                                          "mean_accepted", "wall_s", "tokens_per_s", "hit_rate", "hits", "hit_steps",
                                          "overlap", "overlap_s", "draft_busy_s", "draft_tokens", "draft_forwards",
                                          "equal_to_vanilla"]
    assert (out / "spec_bench.md").exists() and (out / "acceptance_hist.csv").exists()
    assert {"span_s_decode", "span_s_draft", "span_s_verify", "span_s_target-suffix"} <= set(results.columns)
    assert list(results.method) == ["vanilla"] * 3 + ["sd"] * 3 + ["mirror"] * 3  # vanilla runs first
    assert results.equal_to_vanilla.all()
    assert results.loc[results.id == "c", "new_tokens"].iloc[0] == 16  # two turns of 8
    summary = pd.read_csv(out / "summary.csv").set_index("method")
    assert summary.loc["vanilla", "speedup"] == pytest.approx(1.0)
    assert summary.loc["vanilla", "mean_accepted"] == pytest.approx(1.0)
    assert summary.loc["sd", "equal_to_vanilla"] == 1.0
    assert "| method" in (out / "summary.md").read_text()
    mirror = results[results.method == "mirror"]
    assert mirror.hit_rate.between(0, 1).all() and mirror.overlap.between(0, 1).all()
    assert summary.loc["mirror", "hit_rate"] == pytest.approx(mirror.hits.sum() / mirror.hit_steps.sum())  # pooled
    assert summary.loc["mirror", "overlap"] == pytest.approx(mirror.overlap_s.sum() / mirror.draft_busy_s.sum())
    assert results[results.method != "mirror"].hit_rate.isna().all()
    sd = results[results.method == "sd"]  # token by token: one forward per draft token, 3 per window
    assert (sd.draft_tokens == sd.draft_forwards).all() and (sd.draft_tokens % 3 == 0).all()
    assert summary.loc["sd", "draft_tokens_per_forward"] == 1.0 and pd.isna(summary.loc["mirror", "draft_tokens_per_forward"])
    by_category = pd.read_csv(out / "by_category.csv")
    assert set(by_category.category) == {"qa", "math", "multi-turn"} and "hit_rate" in by_category
    step_ms = pd.read_csv(out / "step_ms.csv").set_index("method")  # mean ms per decoding step, by span kind
    spans = results.filter(like="span_s_").groupby(results.method).sum()
    steps = results.groupby("method").steps.sum()
    assert step_ms.loc["vanilla", "decode"] == pytest.approx(1000 * spans.loc["vanilla", "span_s_decode"] / steps["vanilla"])
    assert step_ms.loc["sd", "draft"] > 0 and step_ms.loc["sd", "verify"] > 0 and pd.isna(step_ms.loc["sd", "decode"])
    assert step_ms.loc["mirror", "target-suffix"] > 0 and step_ms.loc["mirror", "draft-rollout"] > 0
    assert "Mean time per decoding step by span kind" in (out / "summary.md").read_text()
    assert not (out / "tuned_kernels.csv").exists()  # nothing tuned on the CPU (models/tuning.py)
    assert not (out / "stage_ms.csv").exists()  # nothing captured on the CPU


def test_bench_writes_the_replay_time_of_every_stage_it_captured(tiny_dirs, tmp_path):
    """stage_ms.csv: each stage set's replay times, as a GPU's captures time them (here set by hand on
    stages made with graphs on, eagerly), labelled by model."""
    from mirror_sd import load_pair
    from mirror_sd.tools.bench import bench

    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), graphs="on")
    prompts = [dict(id="a", category="qa", turns=["t1 t2 t3"])]
    bench(pair, prompts, ["vanilla"], max_new_tokens=2, out_dir=tmp_path / "first")  # makes the stages
    target_stages = pair.stage_sets[pair.target]
    target_stages.replay_ms["full"] = {1: 0.97, 8: 1.34}  # as a capture would have timed them
    stage = target_stages.made("full", 1)  # made by the first bench, eagerly: no launch timed
    stage.launch_ms, stage.from_idle_ms = 0.05, 1.21  # as a capture would have timed it (Stage.time_launch)
    bench(pair, prompts, ["vanilla"], max_new_tokens=2, out_dir=tmp_path / "out")
    table = pd.read_csv(tmp_path / "out" / "stage_ms.csv")
    assert table.columns.tolist() == ["model", "stage", "width", "ms", "launch_ms", "from_idle_ms"]
    assert table.iloc[0].tolist() == ["target", "full", 1, 0.97, 0.05, 1.21]
    assert table.iloc[1, :4].tolist() == ["target", "full", 8, 1.34] and table.iloc[1, 4:].isna().all()


def test_bench_writes_the_kernels_its_stages_tuned(tiny_dirs, tmp_path, monkeypatch):
    from mirror_sd.models import tuning

    kind = ("product", "cuda:0", "1536 x 576", 8, "float32", False)  # as a GPU's stages would have tuned it
    monkeypatch.setattr(tuning, "PLAN", {kind: "skinny"})
    monkeypatch.setattr(tuning, "TIMES", {kind: {"cublas": 52.5, "swapped": 30.0, "skinny": 4.0, "skinny-wide": 6.0}})
    out = tmp_path / "out"
    assert main(["bench", "--methods", "vanilla", "--limit", "1", "--max-new-tokens", "2", "--out", str(out),
                 "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])]) == 0
    tuned = pd.read_csv(out / "tuned_kernels.csv")
    assert tuned.iloc[0][["op", "shape", "rows", "chosen", "skinny"]].tolist() == ["product", "1536 x 576", 8, "skinny", 4.0]


def test_bench_report_gives_the_command_and_one_row_per_method(tiny_dirs, tmp_path, capsys):
    import shlex

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "t1 t2 t3"}))
    report = tmp_path / "report" / "bench.md"  # its folder is made
    argv = ["bench", "--prompts", str(prompts), "--methods", "sd,mirror", "--max-new-tokens", "6", "--out",
            str(tmp_path / "out"), "--report", str(report), "--target", str(tiny_dirs["target"]),
            "--draft", str(tiny_dirs["draft"])]
    assert main(argv) == 0
    text = report.read_text()
    assert f"`python -m mirror_sd {shlex.join(argv)}`" in text
    assert "Date: " in text and "CPU cores" in text and "torch " in text and "lanes: target" in text
    assert f"Models: target {tiny_dirs['target']}, draft {tiny_dirs['draft']}." in text
    main_table = text.split("## In Spec-Bench's layout")[0]  # then the same run in Spec-Bench's layout
    assert "#Mean Accepted Tokens" in text.split("## In Spec-Bench's layout")[1]
    lines = [line for line in main_table.splitlines() if line.startswith("|")]
    header, rows = [c.strip() for c in lines[0].strip("|").split("|")], lines[2:]
    assert header == ["method", "τ (tokens per step)", "speedup vs vanilla", "tokens/s", "device", "hit rate (Mirror-SD)"]
    cells = {row.strip("|").split("|")[0].strip(): [c.strip() for c in row.strip("|").split("|")] for row in rows}
    assert list(cells) == ["vanilla", "sd", "mirror"]  # one row per method, vanilla first
    summary = pd.read_csv(tmp_path / "out" / "summary.csv").set_index("method")
    assert cells["mirror"][1] == f"{summary.loc['mirror', 'mean_accepted']:.3f}"
    assert cells["vanilla"][2] == "1.00×" and cells["vanilla"][4].startswith("target cpu")
    assert "draft" in cells["sd"][4] and cells["vanilla"][5] == "" and float(cells["mirror"][5]) >= 0
    assert "Every method committed vanilla's tokens" in text


def test_unwritable_outputs_stop_bench_and_sweep_before_any_model_loads(tmp_path, capsys, monkeypatch):
    import mirror_sd.cli as cli

    monkeypatch.setattr(cli, "_load", lambda args: pytest.fail("models loaded before the output paths were checked"))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a folder")
    out = ["--out", str(tmp_path / "out")]
    for argv, said in [(["bench", "--methods", "sd", *out, "--report", str(a_file / "bench.md")], "is a file, not a folder"),
                       (["bench", "--methods", "sd", *out, "--report", str(tmp_path)], "is a folder, not a file"),
                       (["bench", "--methods", "sd", "--out", str(a_file)], "is a file, not a folder"),
                       (["sweep", "--method", "sd", "--option", "gamma", "--values", "1,2", "--out", str(a_file)],
                        "is a file, not a folder")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and said in err
    assert not (tmp_path / "out").exists()  # the check creates nothing


def test_bad_prompt_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1, "prompt": "fine"}\n{not json}\n')
    with pytest.raises(MirrorSDError, match="bad.jsonl:2: not valid JSON"):
        read_prompts(bad)
    bad.write_text('{"id": 1, "prompt": ""}\n')
    with pytest.raises(MirrorSDError, match="non-empty"):
        read_prompts(bad)
    with pytest.raises(MirrorSDError, match="does not exist"):
        read_prompts(tmp_path / "missing.jsonl")


def test_bundled_prompts_cover_the_spec_bench_categories(bench_prompts):
    categories = pd.Series([p["category"] for p in bench_prompts]).value_counts()
    assert set(categories.index) == {"multi-turn", "translation", "summarization", "qa", "math", "rag"}
    assert (categories >= 8).all()


def test_sweep_runs_vanilla_once_and_each_value(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "t1 t2 t3"}))
    out = tmp_path / "sweep"
    rc = main(["sweep", "--method", "sd", "--option", "gamma", "--values", "1,3", "--prompts", str(prompts),
               "--max-new-tokens", "8", "--out", str(out), "--raw", "--tree", "0",
               "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])])
    assert rc == 0
    table = pd.read_csv(out / "sweep.csv")
    assert list(table.gamma) == [1, 3] and (table.equal_to_vanilla == 1.0).all()
    assert list(table.method) == ["sd", "sd"] and list(table.fixed) == ["tree 0", "tree 0"]  # the options given
    assert (out / "sweep.html").exists()
    results = pd.read_csv(out / "results.csv")
    assert list(results.method) == ["vanilla", "sd", "sd"]  # vanilla once, then each value
    assert list(results.gamma.fillna(0)) == [0, 1, 3]


def test_a_sweep_without_plotly_keeps_its_numbers_and_says_the_chart_is_missing(tiny_dirs, tmp_path, capsys,
                                                                               monkeypatch):
    for name in ("plotly", "plotly.graph_objects", "plotly.subplots"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as on a bare GPU image
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "t1 t2 t3"}))
    out = tmp_path / "sweep"
    assert main(["sweep", "--method", "sd", "--option", "gamma", "--values", "2", "--prompts", str(prompts),
                 "--max-new-tokens", "4", "--out", str(out), "--raw",
                 "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])]) == 0
    captured = capsys.readouterr()
    assert (out / "sweep.csv").exists() and not (out / "sweep.html").exists()
    assert "plotly is not installed" in captured.err and captured.out.rstrip().endswith("sweep.csv")


def test_sweep_rejects_options_the_method_lacks(tiny_dirs, tmp_path, capsys):
    rc = main(["sweep", "--method", "vanilla", "--option", "gamma", "--values", "1", "--out", str(tmp_path),
               "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])])
    assert rc == 2 and "has no option 'gamma'" in capsys.readouterr().err
    rc = main(["sweep", "--method", "sd", "--option", "gamma", "--values", " , ", "--out", str(tmp_path),
               "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])])
    assert rc == 2 and "--values names no value to sweep" in capsys.readouterr().err


def test_first_per_category(bench_prompts):
    from mirror_sd.tools.bench import first_per_category

    picked = first_per_category(bench_prompts, 2)
    assert len(picked) == 12 and pd.Series([p["category"] for p in picked]).value_counts().eq(2).all()


def test_runs_go_prompt_by_prompt(monkeypatch):
    """After one untimed warm-up run of each, on each prompt vanilla, then every other run: a slow
    spell of the machine hits them alike."""
    import mirror_sd.tools.bench as bench_module
    calls = []

    def fake_run_prompt(pair, item, method, max_new_tokens, **options):
        calls.append((item["id"], method, options.get("gamma")))
        return dict(method=method, id=item["id"], category="qa", new_tokens=4, steps=4, mean_accepted=1.0, wall_s=1.0,
                    tokens_per_s=4.0, hit_rate=None, overlap=None, token_ids=[1, 2, 3, 4])

    monkeypatch.setattr(bench_module, "run_prompt", fake_run_prompt)
    prompts = [dict(id="a", category="qa", turns=["x"]), dict(id="b", category="qa", turns=["y"])]
    results = bench_module.run_interleaved(None, prompts, [("vanilla", {}), ("sd", {"gamma": 2})], 4)
    warmup = [("a", "vanilla", None), ("a", "sd", 2)]  # untimed, not in the rows
    assert calls == warmup + [("a", "vanilla", None), ("a", "sd", 2), ("b", "vanilla", None), ("b", "sd", 2)]
    assert list(results.method) == ["vanilla", "vanilla", "sd", "sd"] and results.equal_to_vanilla.all()


def test_a_setup_before_each_run_puts_in_place_what_it_needs(monkeypatch):
    """run_interleaved's ``setup(index)`` (research/ changes more than a method's options with it): called
    before every run, warm-up included, and each run checked against vanilla's tokens on the same prompt."""
    import mirror_sd.tools.bench as bench_module
    calls = []

    def fake_run_prompt(pair, item, method, max_new_tokens, **options):
        calls.append((item["id"], method, options.get("gamma")))
        tokens = [1, 2, 3, 4] if options.get("gamma") != 3 or item["id"] == "a" else [1, 2, 3, 5]
        return dict(method=method, id=item["id"], category="qa", new_tokens=4, steps=4, mean_accepted=1.0, wall_s=1.0,
                    tokens_per_s=4.0, hit_rate=None, overlap=None, token_ids=tokens)

    monkeypatch.setattr(bench_module, "run_prompt", fake_run_prompt)
    prompts = [dict(id="a", category="qa", turns=["x"]), dict(id="b", category="qa", turns=["y"])]
    results = bench_module.run_interleaved(None, prompts, [("vanilla", {}), ("sd", {"gamma": 3})], 4,
                                           setup=lambda index: calls.append(("setup", index)))
    runs = [("setup", 0), ("a", "vanilla", None), ("setup", 1), ("a", "sd", 3)]
    assert calls == runs + runs + [("setup", 0), ("b", "vanilla", None), ("setup", 1), ("b", "sd", 3)]  # warm-up first
    assert list(results.run) == [0, 0, 1, 1] and list(results.method) == ["vanilla", "vanilla", "sd", "sd"]
    assert list(results.equal_to_vanilla) == [True, True, True, False] and "token_ids" not in results


def test_a_method_off_vanillas_tokens_at_temperature_0_is_named():
    import pandas as pd

    from mirror_sd.tools.bench import equality_warning

    summary = pd.DataFrame(dict(method=["vanilla", "sd", "eagle"], prompts=[6, 6, 6],
                                equal_to_vanilla=[1.0, 5 / 6, 1.0]))
    warning = equality_warning(summary, temperature=0.0)
    assert "sd on 1 of 6 prompts" in warning and "eagle" not in warning and "fp32" in warning
    assert equality_warning(summary, temperature=0.8) is None  # sampling: tokens differ by design
    assert equality_warning(summary[summary.method != "sd"], temperature=0.0) is None


def test_step_costs_account_for_every_decoding_step(tiny_dirs, tmp_path, capsys):
    """scripts.step_costs: every decoding step of every run counted once, its tokens summing to the
    bench's; Mirror-SD's steps split by window and outcome, every other method's in one kind."""
    from scripts.step_costs import step_costs
    from scripts.whatif_check import read_runs

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": i, "category": "qa", "prompt": p})
                                 for i, p in [("a", "t1 t2 t3"), ("b", "t4 t5")]))
    out = tmp_path / "out"
    assert main(["bench", "--prompts", str(prompts), "--methods", "sd,mirror", "--max-new-tokens", "12",
                 "--out", str(out), "--traces", str(out / "traces"), "--target", str(tiny_dirs["target"]),
                 "--draft", str(tiny_dirs["draft"])]) == 0
    table = step_costs(read_runs(out)).reset_index()
    results = pd.read_csv(out / "results.csv")
    by_method = table.groupby("method")
    steps = by_method.steps.sum()
    tokens = (table.steps * table["tokens per step"]).groupby(table.method).sum()
    for method, runs in results.groupby("method"):
        assert steps[method] == runs.steps.sum()  # every decoding step (the prefill is not one)
        assert tokens[method] == pytest.approx(runs.new_tokens.sum() - len(runs))  # the prefill commits one
    assert set(table[table.method != "mirror"].kind) == {"step"}
    assert set(table[table.method == "mirror"].kind) <= {f"{w} -> {o}" for w in ("hit's branch", "copied", "fallback")
                                                         for o in ("hit", "miss")}
    assert by_method.share.sum().round(6).eq(1).all() and (table["ms per step"] > 0).all()
    assert ((0 <= table["idle ms per step"]) & (table["idle ms per step"] < table["ms per step"])).all()
    from mirror_sd.tools.gpu_check import step_cost_section  # gpu-check's report shows the same table
    section = "\n".join(step_cost_section(out / "traces"))
    assert section.startswith("\n## Step costs") and "'mirror'" in section and "'sd'" in section
    assert step_cost_section(tmp_path / "no-traces") == []


def test_a_method_that_fails_is_left_out_and_the_others_go_on(tiny_dirs, tmp_path, capsys, monkeypatch):
    """As on a GPU where one method's decoding fails: its rows are left out of every table (the
    prompts it finished too, so every row compares the same prompts), the other methods run to the
    end and are written, the summary and the report name it and why, and the command exits 2 with
    one error line for it."""
    import mirror_sd.tools.bench as bench_module

    real = bench_module.generate

    def failing_on_b(pair, messages, method, **kwargs):
        out = real(pair, messages, method=method, **kwargs)
        if method == "sd" and "t4" in str(messages):
            out.error = "decoding failed after 0 tokens: RuntimeError: a stage broke"
        return out

    monkeypatch.setattr(bench_module, "generate", failing_on_b)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in [{"id": "a", "category": "qa", "prompt": "t1 t2 t3"},
                                                          {"id": "b", "category": "math", "prompt": "t4 t5"},
                                                          {"id": "c", "category": "qa", "prompt": "t6 t7"}]))
    out, report = tmp_path / "out", tmp_path / "bench.md"
    rc = main(["bench", "--prompts", str(prompts), "--methods", "sd,mirror", "--max-new-tokens", "6", "--gamma", "3",
               "--out", str(out), "--report", str(report), "--target", str(tiny_dirs["target"]),
               "--draft", str(tiny_dirs["draft"])])
    err = capsys.readouterr().err
    assert rc == 2
    results = pd.read_csv(out / "results.csv")
    assert list(results.method) == ["vanilla"] * 3 + ["mirror"] * 3 and results.equal_to_vanilla.all()
    assert list(pd.read_csv(out / "summary.csv").method) == ["vanilla", "mirror"]
    for text in ((out / "summary.md").read_text(), report.read_text()):
        assert "- sd: sd on prompt b: decoding failed after 0 tokens: RuntimeError: a stage broke" in text
    said = [line for line in err.splitlines() if line.startswith("error: sd failed and is left out")]
    assert len(said) == 1 and "a stage broke" in said[0] and str(out) in said[0]


def test_vanilla_failing_stops_the_bench(monkeypatch):
    """Vanilla is every other run's reference: without it nothing can be compared."""
    import mirror_sd.tools.bench as bench_module

    def fake_run_prompt(pair, item, method, max_new_tokens, **options):
        raise MirrorSDError(f"{method} on prompt {item['id']}: decoding failed")

    monkeypatch.setattr(bench_module, "run_prompt", fake_run_prompt)
    with pytest.raises(MirrorSDError, match="vanilla on prompt a"):
        bench_module.run_interleaved(None, [dict(id="a", category="qa", turns=["x"])], [("vanilla", {}), ("sd", {})], 4)


def test_a_sweep_leaves_out_the_values_that_fail(tiny_dirs, tmp_path, capsys, monkeypatch):
    import mirror_sd.tools.bench as bench_module

    real = bench_module.run_prompt

    def failing_at_gamma_3(pair, item, method, max_new_tokens, **options):
        if options.get("gamma") == 3:
            raise MirrorSDError(f"{method} on prompt {item['id']}: decoding failed after 0 tokens")
        return real(pair, item, method, max_new_tokens, **options)

    monkeypatch.setattr(bench_module, "run_prompt", failing_at_gamma_3)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "qa", "prompt": "t1 t2 t3"}))
    argv = ["sweep", "--method", "sd", "--option", "gamma", "--values", "1,3", "--prompts", str(prompts),
            "--max-new-tokens", "6", "--raw", "--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"])]
    assert main([*argv, "--out", str(tmp_path / "sweep")]) == 2
    assert list(pd.read_csv(tmp_path / "sweep" / "sweep.csv").gamma) == [1]
    assert "error: sd at gamma 3 failed and is left out" in capsys.readouterr().err
    assert main([*argv[:6], "3", *argv[7:], "--out", str(tmp_path / "none")]) == 2  # every value failed
    assert capsys.readouterr().err.strip().splitlines()[-1] == ("error: sd failed at every value of gamma: "
                                                                "sd on prompt a: decoding failed after 0 tokens")
