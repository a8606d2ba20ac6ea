"""The command line: JSON output, Chrome traces, and one-line errors instead of tracebacks."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mirror_sd.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _tiny_args(tiny_dirs):
    return ["--target", str(tiny_dirs["target"]), "--draft", str(tiny_dirs["draft"]), "--raw"]


def test_generate_json_and_trace(tiny_dirs, tmp_path, capsys):
    trace_file = tmp_path / "trace.json"
    rc = main(["generate", "--method", "sd", "--prompt", "t1 t2 t3", "--max-new-tokens", "6", "--gamma", "2",
               "--json", "--trace", str(trace_file), *_tiny_args(tiny_dirs)])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert {"method", "text", "token_ids", "metrics"} <= set(data)
    assert data["method"] == "sd" and len(data["token_ids"]) == 6
    assert data["dtype"] == "fp32: no native bf16"  # dtype auto, as the suite runs it (conftest.py)
    assert {"new_tokens", "steps", "mean_accepted", "wall_s", "tokens_per_s"} <= set(data["metrics"])
    events = json.loads(trace_file.read_text())["traceEvents"]
    assert any(e["ph"] == "X" and e["cat"] == "verify" for e in events)


def test_a_trace_in_a_new_folder_is_written_and_a_bad_trace_path_loses_no_work(tiny_dirs, tmp_path, capsys):
    nested = tmp_path / "new" / "folder" / "trace.json"
    args = ["generate", "--method", "sd", "--prompt", "t1 t2 t3", "--max-new-tokens", "4", *_tiny_args(tiny_dirs)]
    assert main([*args, "--trace", str(nested)]) == 0 and nested.exists()  # the folders are made
    text = capsys.readouterr().out
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main([*args, "--trace", str(blocker / "trace.json")]) == 2  # refused before any decoding
    out, err = capsys.readouterr()
    assert out == "" and err.count("error:") == 1 and "is a file" in err
    assert text.strip()  # what the first run generated was printed


@pytest.mark.parametrize("argv,message", [
    (["--prompt", ""], "prompt is empty"),
    (["--prompt", "t1", "--max-new-tokens", "0"], "max_new_tokens"),
    (["--prompt", "t1", "--gamma", "0"], "gamma must be between"),
    (["--prompt", "t1", "--method", "warp"], "unknown method 'warp'"),
    (["--prompt", "t1", "--target-device", "cuda:3"], "not available"),
    (["--prompt", "t1", "--draft-device", "quantum"], "unknown device"),
    (["--prompt", "t1", "--target-device", "cpu:5"], "name the CPU as 'cpu'"),
    (["--prompt", "t1", "--gamma", "2.5"], "argument --gamma: invalid int value"),
    (["--prompt", "t1", "--bogus", "3"], "unrecognized arguments: --bogus"),
])
def test_bad_input_is_one_clear_line(tiny_dirs, capsys, argv, message):
    rc = main(["generate", *argv, *_tiny_args(tiny_dirs)])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and message in err and "Traceback" not in err


@pytest.mark.parametrize("argv,message", [
    (["bench", "--methods", "vanilla", "--kappa", "3"], "--kappa: taken by none of the methods run here (vanilla)"),
    (["sweep", "--method", "sd", "--option", "gamma", "--values", "1,2", "--kappa", "3"], "--kappa: taken by none"),
])
def test_an_option_no_benched_method_takes_is_refused_not_dropped(tiny_dirs, capsys, argv, message):
    assert main([*argv, "--limit", "1", *_tiny_args(tiny_dirs)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1


def test_a_prompt_file_line_that_is_not_an_object_is_one_clear_line(tiny_dirs, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"id": "a", "category": "qa", "prompt": "t1"}\n[1, 2]\n')
    assert main(["bench", "--methods", "vanilla", "--prompts", str(prompts), *_tiny_args(tiny_dirs)]) == 2
    assert "prompts.jsonl:2: a line is a JSON object" in capsys.readouterr().err


def test_python_dash_m_entry_point_reports_unknown_model():
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "mirror_sd", "generate", "--prompt", "hi", "--target", "nobody/nothing"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 2
    assert "error: could not fetch 'nobody/nothing'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_help_gives_each_methods_default_for_a_shared_option():
    from mirror_sd.cli import build_parser
    from mirror_sd.methods import METHODS

    text = " ".join(build_parser()._subparsers._group_actions[0].choices["generate"].format_help().split())
    defaults = {m: {o.name: o.default for o in METHODS[m].options} for m in ("sd", "mirror", "ss", "eagle")}
    assert defaults["sd"]["gamma"] == defaults["mirror"]["gamma"]  # one help text for both
    assert "sd/mirror: draft tokens per step" in text and f"(default {defaults['sd']['gamma']})" in text
    assert "ss: stream levels in the draft" in text and f"(default {defaults['ss']['gamma']})" in text
    assert "ss: candidates per stream" in text and "eagle: children per expanded node" in text


def test_methods_lists_each_option_as_its_command_line_flag(capsys):
    from mirror_sd.methods import METHODS

    assert main(["methods"]) == 0
    listing = capsys.readouterr().out
    for method in METHODS.values():
        line = next(row for row in listing.splitlines() if row.startswith(method.name + " "))
        for opt in method.options:
            assert f"--{opt.name.replace('_', '-')} (default {opt.default}" in line
    assert "--top-k" in listing and "--top_k" not in listing
    assert "--branching (default 4; with --streams 0)" in listing  # sd's draft tree: one drafter's option
    sd = next(row for row in listing.splitlines() if row.startswith("sd "))
    assert sd.count("(default") == len(METHODS["sd"].options) <= 5
    assert "--tree (default 0; with --streams 0; temperature 0 only)" in listing


def test_fp32_drafting_turns_int8_drafting_off(tiny_dirs):
    from mirror_sd.cli import _load, build_parser
    from mirror_sd.models.linear import INT8

    parse = build_parser().parse_args
    assert _load(parse(["generate", "--prompt", "t1", *_tiny_args(tiny_dirs)])).int8_drafting == INT8
    assert _load(parse(["generate", "--prompt", "t1", "--fp32-drafting", *_tiny_args(tiny_dirs)])).int8_drafting is False


def test_a_failed_draft_lane_prints_the_whole_text_and_a_note(tiny_dirs, capsys, monkeypatch):
    from mirror_sd.devices import Lane

    args = ["generate", "--prompt", "t1 t2 t3", "--max-new-tokens", "8", *_tiny_args(tiny_dirs)]
    assert main([*args, "--method", "vanilla"]) == 0
    vanilla = capsys.readouterr().out
    submit = Lane.submit

    def broken(*args, **kwargs):
        raise RuntimeError("draft device lost")

    def failing(lane, kind, fn, *args, **kwargs):  # the draft lane fails from step 2 on
        return submit(lane, kind, broken if lane.name == "draft" and kwargs.get("step", 0) >= 2 else fn, *args, **kwargs)

    monkeypatch.setattr(Lane, "submit", failing)
    assert main([*args, "--method", "sd"]) == 0
    out, err = capsys.readouterr()
    assert out == vanilla
    assert "note: draft lane failed at step 2: RuntimeError: draft device lost; finished target-only" in err
