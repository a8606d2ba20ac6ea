"""Spec-Bench's own question file as the bench reads it, and the run reported in its layout (spec_bench.py)."""
import json

import pandas as pd
import pytest

from mirror_sd.tools.bench import bench, first_per_category, read_prompts
from mirror_sd.tools.spec_bench import MT_BENCH, SPEC_BENCH_TASKS

OTHERS = ("translation", "summarization", "qa", "math_reasoning", "rag")


@pytest.fixture
def question_file(tmp_path):
    """A small file in Spec-Bench's exact format: MT-Bench's questions 81.. (two turns, eight categories,
    two each, in its order), then two questions of each other task (one turn, and a "reference")."""
    lines, qid = [], 81
    for category in MT_BENCH:
        for _ in range(2):
            lines.append(dict(question_id=qid, category=category, turns=[f"t{qid % 16} t3", f"t{qid % 7} t5"]))
            qid += 1
    for task in OTHERS:
        for _ in range(2):
            lines.append(dict(question_id=qid, category=task, turns=[f"t{qid % 16} t1 t2"], reference=["x"]))
            qid += 1
    path = tmp_path / "question.jsonl"
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    return path


def test_the_question_file_is_read_as_it_is(question_file):
    prompts = read_prompts(question_file)
    assert [p["id"] for p in prompts] == [str(q) for q in range(81, 81 + len(prompts))]  # question_id, not the line
    assert {p["category"] for p in prompts} == set(SPEC_BENCH_TASKS)  # the eight MT-Bench categories folded
    mt = [p for p in prompts if p["task"] == "mt_bench"]
    assert [p["subcategory"] for p in mt[::2]] == list(MT_BENCH) and all(len(p["turns"]) == 2 for p in mt)
    picked = first_per_category(prompts, 4)
    assert len(picked) == 4 + 2 * 5  # 4 of mt_bench; the others hold 2 each
    assert [p["subcategory"] for p in picked if p["task"] == "mt_bench"] == list(MT_BENCH[:4])  # spread, not 4 writing
    bundled = read_prompts(__import__("mirror_sd.tools.bench", fromlist=["DEFAULT_PROMPTS"]).DEFAULT_PROMPTS)
    assert {p["task"] for p in bundled} == set(SPEC_BENCH_TASKS) and "question_id" not in bundled[0]


def test_a_bench_on_it_reports_spec_benchs_columns_and_the_acceptance_histograms(tiny_pair, question_file, tmp_path):
    prompts = first_per_category(read_prompts(question_file), 1)
    out = tmp_path / "out"
    bench(tiny_pair, prompts, ["vanilla", "sd"], max_new_tokens=6, out_dir=out, raw=True)
    spec = pd.read_csv(out / "spec_bench.csv")
    assert list(spec.method) == ["vanilla", "sd"] and spec.loc[0, "overall"] == pytest.approx(1.0)
    assert [c for c in spec.columns if not c.startswith("tau_")] == ["method", *SPEC_BENCH_TASKS, "overall"]
    results = pd.read_csv(out / "results.csv")
    sd = results[results.method == "sd"].assign(speed=lambda r: r.new_tokens / r.wall_s)
    vanilla = results[results.method == "vanilla"].assign(speed=lambda r: r.new_tokens / r.wall_s)
    assert spec.loc[1, "overall"] == pytest.approx(sd.speed.mean() / vanilla.speed.mean())  # as speed.py
    qa = sd[sd.task == "qa"]
    assert spec.loc[1, "qa"] == pytest.approx(qa.speed.mean() / vanilla[vanilla.task == "qa"].speed.mean())
    assert spec.loc[1, "tau_overall"] == pytest.approx((sd.mean_accepted * sd.steps).sum() / sd.steps.sum())
    page = (out / "spec_bench.md").read_text()
    for column in ("Multi-turn Conversation", "Translation", "Summarization", "Question Answering",
                   "Mathematical Reasoning", "Retrieval-aug. Generation", "#Mean Accepted Tokens", "Overall"):
        assert column in page
    assert "6 questions" in page and "at most 6 new tokens" in page and "temperature 0" in page
    hist = pd.read_csv(out / "acceptance_hist.csv")
    overall = hist[(hist.method == "sd") & (hist.task == "overall")]
    assert overall.share.sum() == pytest.approx(1.0) and overall.steps.sum() == sd.steps.sum()
    assert (overall.length * overall.steps).sum() / overall.steps.sum() == pytest.approx(spec.loc[1, "tau_overall"])
    assert (out / "acceptance_hist.html").exists() and "Spec-Bench's layout" in (out / "summary.md").read_text()
