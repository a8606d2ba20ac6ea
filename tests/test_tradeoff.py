"""``python -m mirror_sd tradeoff``: drafts of growing capacity, measured in one run, then re-timed (MODELLED)."""
import json

import pandas as pd
import pytest
import torch

from mirror_sd import load_pair
from mirror_sd.cli import main
from mirror_sd.models.exit_head import attach_exit_head, new_exit_head
from mirror_sd.tools.tradeoff import tradeoff, verdict

PROMPTS = [{"id": "a", "category": "qa", "turns": ["t1 t2 t3"]}, {"id": "b", "category": "math", "turns": ["t4 t5"]}]


@pytest.fixture(scope="module")
def pair_with_exit_heads(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    torch.manual_seed(3)
    head = new_exit_head(pair.target, 1, mlp=16)
    torch.nn.init.normal_(head.down.weight, std=0.3)
    attach_exit_head(pair, head)
    return pair


def test_one_run_measures_every_draft_and_retimes_it_on_each_profile(pair_with_exit_heads, tmp_path):
    pair = pair_with_exit_heads
    first = pair.draft_name
    table = tradeoff(pair, PROMPTS, drafts=["default", "exit:1"], gammas=[1, 2], max_new_tokens=6, out_dir=tmp_path,
                     profiles=["this-machine", "paper-14b"], raw=True)
    assert list(table.draft) == [first, "exit:1"]
    assert (table.cost > 0).all() and set(table.sd_gamma) <= {1, 2}
    assert table[["sd_tau", "mirror_tau", "sd_speedup", "mirror_speedup"]].notna().all().all()
    results = pd.read_csv(tmp_path / "results.csv")
    assert results.equal_to_vanilla.all()  # every run of every draft commits vanilla's tokens
    drafted = results[results.method != "eagle"]  # the tiny target has no EAGLE head: that run is left out
    assert len(drafted) == len(PROMPTS) * (1 + 2 * 3)  # vanilla, and per draft sd at 2 gammas and mirror
    assert table.attrs["failed"] == {1: table.attrs["failed"][1]} and "EAGLE head" in table.attrs["failed"][1]
    modelled = pd.read_csv(tmp_path / "modelled.csv")
    assert set(modelled.profile) == {"this-machine", "paper-14b"} and len(modelled) == 2 * len(table)
    assert {"rollout_ms", "suffix_ms", "outgrows_suffix"} <= set(modelled.columns)
    report = (tmp_path / "tradeoff.md").read_text()
    assert "## MODELLED" in report and "Measured here:" in report and "MODELLED on paper-14b:" in report
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["prompts"] == 2 and meta["max_new_tokens"] == 6
    assert (tmp_path / "tradeoff.html").exists()


def test_the_sentence_names_who_leads_where_and_why():
    rows = pd.DataFrame(dict(draft=["small", "big"], sd_speedup=[1.2, 0.9], mirror_speedup=[1.1, 1.4],
                             eagle_speedup=[1.3, 1.3], mirror_tau=[2.0, 3.0], eagle_tau=[2.5, 2.5],
                             outgrows_suffix=[False, True]))
    text = verdict(rows, "There")
    assert text.startswith("There: sd peaks at 1.20x with small, Mirror-SD at 1.40x with big, EAGLE is at 1.30x")
    assert "Mirror-SD leads with big" in text and "from big on its rollouts outgrow the suffix" in text
    behind = verdict(rows.assign(mirror_speedup=[1.0, 1.1], mirror_tau=[2.0, 2.2]), "Here")
    assert "Mirror-SD leads with none of these drafts, since even its best τ (2.20) is below EAGLE's (2.50)" in behind


def test_bad_settings_get_one_line(capsys, tmp_path):
    assert main(["tradeoff", "--gammas", "2,x", "--out", str(tmp_path / "o")]) == 2
    assert main(["tradeoff", "--profiles", "nowhere", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("error: --gammas must be comma-separated whole numbers")
    assert err[1].startswith("error: ") and "nowhere" in err[1]
