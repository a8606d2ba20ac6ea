"""``python -m mirror_sd tune`` (mirror_sd/tools/tune.py): the search's plan, one run on the tiny
pair through the whole command, and its refusals."""
import json

import pandas as pd
import pytest

from mirror_sd.cli import main
from mirror_sd.tools import tune as T
from mirror_sd.tools import whatif as W


def test_a_setting_s_key_names_only_what_differs_from_the_defaults():
    assert T.key("sd", {"gamma": 2}) == T.key("sd", {}) == "sd"
    assert T.key("mirror", {"kappa": 8, "gamma": 4}) == "mirror gamma=4 kappa=8"


def test_neighbours_move_one_searched_option_one_step_along_its_ladder():
    moved = T.neighbours("sd", {"gamma": 4})
    assert {"gamma": 3} in moved and {"gamma": 5} in moved and {"gamma": 4, "tree": 8} in moved
    assert len(moved) == 3  # tree 0 is the lowest rung: nothing below it
    top = T.neighbours("eagle", {"depth": 8, "top_k": 10, "total_tokens": 64})
    assert {"depth": 7, "top_k": 10, "total_tokens": 64} in top and not any(n["depth"] > 8 for n in top)


def test_every_coarse_setting_is_one_the_method_takes():
    from mirror_sd.methods import get_method

    for method, space in T.SEARCH.items():
        for options in space.coarse:
            get_method(method).resolve_options(options)  # raises on an unknown or out-of-range value
            assert set(options) <= set(space.ladders)


@pytest.mark.parametrize("args, message", [
    (["--profiles", "paper-15b"], "unknown profile 'paper-15b'"),
    (["--profiles", ","], "--profiles names no profile"),
    (["--methods", "vanilla"], "--methods names nothing to search"),
    (["--methods", ""], "--methods names nothing to search"),
    (["--methods", "sd,medusa"], "not 'medusa'"),
    (["--rounds", "-1"], "--rounds must be 0 or more"),
    (["--gamma", "3"], "unrecognized arguments: --gamma"),
    (["--temperature", "0.7"], "tune runs at temperature 0"),
])
def test_bad_tune_input_is_one_error_line_and_status_2(args, message, capsys, tmp_path):
    assert main(["tune", "--out", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0]
    assert not (tmp_path / "out").exists()  # refused before any model loaded or file written


def test_an_empty_search_is_refused_by_the_library_too(tiny_pair, tmp_path):
    with pytest.raises(Exception, match="nothing to search"):
        T.tune(tiny_pair, [{"id": "a", "category": "qa", "turns": ["t1 t2"]}], methods=["vanilla"],
               out_dir=tmp_path)


def test_tune_runs_each_setting_once_and_keeps_each_profile_s_fastest(tiny_pair, tmp_path):
    """Round 0 runs the coarse grid and the paper row; round 1 the neighbours of each profile's best.
    tuned.csv's row per (profile, method) is the searched setting with the highest MODELLED speedup
    there, and every setting committed vanilla's tokens."""
    search = {"sd": T.Space(dict(gamma=(1, 2, 3)), ({"gamma": 1}, {"gamma": 3})),
              "mirror": T.Space(dict(gamma=(1, 2), branch_budget=(4, 16)), ({"gamma": 1},))}
    prompts = [{"id": "a", "category": "qa", "turns": ["t1 t2 t3"]}]
    best = T.tune(tiny_pair, prompts, methods=["sd", "mirror"], profiles=["paper-14b", T.THIS_MACHINE], rounds=1,
                  max_new_tokens=6, out_dir=tmp_path, search=search)
    searched = pd.read_csv(tmp_path / "searched.csv")
    assert searched.equal_to_vanilla.all() and not best.attrs["unequal"]
    assert searched.setting.is_unique  # each setting ran once
    assert set(searched["round"]) == {0, 1}
    assert "sd" in set(searched.setting)  # gamma 2 (the default), a neighbour of round 0's best sd
    assert searched.paper.sum() == 1
    tuned = pd.read_csv(tmp_path / "tuned.csv")
    for profile in ("paper-14b", T.THIS_MACHINE):
        for method in ("sd", "mirror"):
            row = tuned[(tuned.profile == profile) & (tuned.method == method)].iloc[0]
            candidates = searched[searched.method == method]
            assert row.speedup == pytest.approx(candidates[f"speedup@{profile}"].max())
            assert row.step_ms == pytest.approx(candidates.loc[candidates[f"speedup@{profile}"].idxmax(),
                                                               f"step_ms@{profile}"])
        assert (tuned[tuned.profile == profile].method == T.PAPER).sum() == 1
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert meta["settings_run"] == (searched.method != "vanilla").sum() and meta["threads"]["mirror"]
    W.Profile.from_json(json.loads((tmp_path / "profile-this-machine.json").read_text()))
    assert "Every setting searched" in (tmp_path / "tuned.md").read_text()
