"""Another target, end to end from the command line: its data (``train data --target``), its add-ons
(``train eagle / exit-head / ss --target``), then every method with them (``--add-on``), lossless."""
import json

import pytest

from mirror_sd import MirrorSDError, generate, load_pair
from mirror_sd.models.add_ons import add_on_kind
from mirror_sd.cli import main as cli
from mirror_sd.train.__main__ import main as train

PROMPTS = [" ".join(f"t{(3 * i + j) % 16}" for j in range(4 + i % 3)) for i in range(10)]


@pytest.fixture(scope="module")
def tiny_data(tiny_dirs, tmp_path_factory):
    """`train data --target TINY` over prompts written beforehand (as --prompts-only leaves them)."""
    out = tmp_path_factory.mktemp("tiny-data")
    with (out / "prompts.jsonl").open("w") as f:
        for i, text in enumerate(PROMPTS):
            f.write(json.dumps(dict(id=f"qa-{i:06d}", category="qa", source="test",
                                    messages=[{"role": "user", "content": text}])) + "\n")
    assert train(["data", "--target", str(tiny_dirs["target"]), "--out", str(out), "--num-prompts", str(len(PROMPTS)),
                  "--max-new-tokens", "12", "--batch-size", "4", "--threads", "1"]) == 0
    return out


@pytest.fixture(scope="module")
def add_ons(tiny_dirs, tiny_data, tmp_path_factory):
    """An EAGLE head, an early-exit head at layer 1 and two speculative streams, trained briefly for
    the tiny target from the command line: {kind: folder}."""
    root = tmp_path_factory.mktemp("add-ons")
    shared = ["--target", str(tiny_dirs["target"]), "--data", str(tiny_data), "--threads", "1", "--eval-every", "5"]
    commands = {
        "eagle": ["eagle", "--features", str(root / "features"), "--vocab", "16", "--epochs", "2"],
        "exit": ["exit-head", "--features", str(root / "features"), "--exit-layer", "1", "--rank", "4",
                 "--epochs", "2"],
        "streams": ["ss", "--streams", "2", "--stream-layers", "1", "--rank", "2", "--vocab", "16", "--epochs", "1"],
    }
    for name, command in commands.items():
        assert train([*command, *shared, "--out", str(root / name)]) == 0, name
    return {name: root / name for name in commands}


@pytest.fixture(scope="module")
def own_draft(tiny_dirs, tiny_data, tmp_path_factory):
    """A draft distilled for the tiny target from one of its layers (`train draft --target`), with
    streams of its own (`train ss --target --model`): it borrows the tiny target's embedding."""
    out = tmp_path_factory.mktemp("own-draft") / "draft"
    shared = ["--target", str(tiny_dirs["target"]), "--data", str(tiny_data), "--threads", "1", "--eval-every", "5"]
    assert train(["draft", *shared, "--out", str(out), "--layers", "0", "--vocab", "16", "--epochs", "1"]) == 0
    assert train(["ss", *shared, "--model", str(out), "--out", str(out / "streams"), "--streams", "2",
                  "--stream-layers", "1", "--rank", "2", "--epochs", "1"]) == 0
    return out


def test_data_for_another_target_holds_its_own_answers_as_the_engine_decodes_them(tiny_dirs, tiny_data, tiny_pair):
    config = json.loads((tiny_data / "config.json").read_text())
    assert config["target"] == tiny_dirs["target"].name
    rows = [json.loads(line) for line in (tiny_data / "data.jsonl").read_text().splitlines()]
    assert len(rows) == len(PROMPTS)
    for row in rows:
        prompt = PROMPTS[int(row["id"].split("-")[1])]
        assert row["prompt_ids"] == tiny_pair.encode(prompt)  # no chat template: the engine's plain text
        out = generate(tiny_pair, prompt, method="vanilla", max_new_tokens=12)
        assert row["answer_ids"] == out.token_ids
    assert "No chat template" in (tiny_data / "README.md").read_text()


def test_trainers_refuse_data_made_with_another_target(tiny_dirs, tiny_data, tmp_path, capsys):
    embedded_data = tmp_path / "embedded-data"  # a folder from before --target: the embedded target's
    embedded_data.mkdir()
    (embedded_data / "config.json").write_text(json.dumps(dict(source="corpora")))
    (embedded_data / "data.jsonl").write_text("")
    rc = train(["eagle", "--target", str(tiny_dirs["target"]), "--data", str(embedded_data),
                "--out", str(tmp_path / "h")])
    err = capsys.readouterr().err
    assert rc == 2 and "made with target 'smollm2-135m-instruct', not 'target'" in err and "data --target" in err
    rc = train(["exit-head", "--data", str(tiny_data), "--out", str(tmp_path / "x")])  # no --target: the embedded one
    assert rc == 2 and "made with target 'target', not 'smollm2-135m-instruct'" in capsys.readouterr().err
    assert not (tmp_path / "h").exists() and not (tmp_path / "x").exists()


def test_each_add_on_is_known_by_its_files(add_ons):
    assert add_on_kind(add_ons["eagle"]) == "EAGLE head"
    assert add_on_kind(add_ons["exit"]) == "early-exit head"
    assert add_on_kind(add_ons["streams"]) == "speculative streams"


def test_every_method_runs_with_add_ons_trained_from_the_command_line_and_commits_vanillas_tokens(tiny_dirs, add_ons):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), add_ons=list(add_ons.values()))
    runs = dict(vanilla={}, eagle={}, ss=dict(gamma=2), sd=dict(gamma=2),
                mirror=dict(exit_layer=1, gamma=2))  # the head attached for layer 1
    for prompt in PROMPTS[:3]:
        outs = {m: generate(pair, prompt, method=m, max_new_tokens=16, **o) for m, o in runs.items()}
        for method, out in outs.items():
            assert out.error is None and out.token_ids == outs["vanilla"].token_ids, method
        labels = {s.label for s in outs["mirror"].trace.spans if s.kind == "target-prefix"}
        assert labels and all("trained early exit" in label for label in labels)
    assert pair.exit_heads[1].exit_layer == 1
    assert outs["mirror"].trace.meta["add_ons"] == [f"EAGLE head: {add_ons['eagle']}",
                                                    f"early-exit head (layer 1): {add_ons['exit']}",
                                                    f"speculative streams: {add_ons['streams']}"]


def test_a_draft_and_its_streams_trained_for_another_target_are_lossless(tiny_dirs, own_draft):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(own_draft))
    for prompt in PROMPTS[:3]:
        vanilla = generate(pair, prompt, method="vanilla", max_new_tokens=16).token_ids
        for options in (dict(gamma=3), dict(gamma=2, streams=1)):
            out = generate(pair, prompt, method="sd", max_new_tokens=16, **options)
            assert out.error is None and out.token_ids == vanilla, options


def test_the_command_line_takes_add_ons_and_says_which_is_missing(tiny_dirs, add_ons, tmp_path, capsys):
    target = ["--target", str(tiny_dirs["target"]), "--prompt", "t1 t2 t3", "--max-new-tokens", "6", "--json"]
    assert cli(["generate", "--method", "eagle", *target, "--add-on", str(add_ons["eagle"])]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "eagle"
    assert cli(["generate", "--method", "eagle", *target]) == 2  # no head: one line that says how to get one
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--add-on HEAD" in err and "train eagle --target" in err
    assert cli(["generate", "--method", "ss", *target, "--add-on", str(add_ons["eagle"])]) == 2
    assert "--add-on STREAMS" in capsys.readouterr().err
    report = tmp_path / "bench.md"  # the report names the add-ons its numbers came from
    assert cli(["bench", "--methods", "eagle", "--target", str(tiny_dirs["target"]), "--limit", "1",
                "--max-new-tokens", "4", "--out", str(tmp_path / "bench"), "--report", str(report),
                "--add-on", str(add_ons["eagle"])]) == 0
    assert f"Models: target {tiny_dirs['target']}, no draft; EAGLE head: {add_ons['eagle']}." in report.read_text()


def test_a_folder_that_is_no_add_on_or_for_another_target_is_refused(tiny_dirs, tiny_data, add_ons, tmp_path):
    with pytest.raises(MirrorSDError, match="is not an add-on this engine knows"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, add_ons=[tiny_data])
    with pytest.raises(MirrorSDError, match="no such folder"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, add_ons=[tmp_path / "missing"])
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(MirrorSDError, match="its config.json is not JSON"):
        add_on_kind(tmp_path / "broken")
    other = tiny_dirs["other_vocab"]  # another tiny target: same shapes, other weights and tokens
    with pytest.raises(MirrorSDError, match="another target"):
        load_pair(target=str(other), draft=None, add_ons=[add_ons["exit"]])


def test_an_add_on_for_the_embedded_target_replaces_the_shipped_one(embedded_pair, tmp_path):
    from mirror_sd.models.exit_head import new_exit_head, save_exit_head

    save_exit_head(new_exit_head(embedded_pair.target, 22, rank=8), tmp_path / "head", embedded_pair.target,
                   "SmolLM2-135M-Instruct", card={})
    pair = load_pair(add_ons=[tmp_path / "head"])  # a pair of its own: the session's embedded pair stays as shipped
    assert pair.exit_heads[22].size == dict(rank=8)  # the shipped head is a SwiGLU
    prompt = "Why is the sky blue?"
    mirror = generate(pair, prompt, method="mirror", max_new_tokens=16)
    assert mirror.token_ids == generate(pair, prompt, method="vanilla", max_new_tokens=16).token_ids


def test_a_hub_id_names_the_target_in_data_cards_and_runs(tiny_dirs, tmp_path, monkeypatch, capsys):
    """--target org/name, served from a Hugging Face cache with the hub offline: the data, the head's
    card and the run all name the target "org/name" and agree with each other."""
    import shutil

    import huggingface_hub.constants as hub

    snapshot = tmp_path / "hub" / "models--acme--tiny-chat" / "snapshots" / "abc123"
    shutil.copytree(tiny_dirs["target"], snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    data, head = tmp_path / "data", tmp_path / "head"
    data.mkdir()
    (data / "prompts.jsonl").write_text("".join(json.dumps(dict(id=f"qa-{i:06d}", category="qa", source="test",
                                                               messages=[{"role": "user", "content": p}])) + "\n"
                                                for i, p in enumerate(PROMPTS)))
    assert train(["data", "--target", "acme/tiny-chat", "--out", str(data), "--num-prompts", str(len(PROMPTS)),
                  "--max-new-tokens", "8", "--threads", "1"]) == 0
    assert json.loads((data / "config.json").read_text())["target"] == "acme/tiny-chat"
    assert train(["exit-head", "--target", "acme/tiny-chat", "--data", str(data), "--out", str(head), "--exit-layer",
                  "1", "--rank", "4", "--epochs", "1", "--threads", "1", "--features", str(tmp_path / "f")]) == 0
    assert json.loads((head / "config.json").read_text())["target"] == "acme/tiny-chat"
    capsys.readouterr()
    assert cli(["generate", "--method", "mirror", "--target", "acme/tiny-chat", "--draft", "self:1", "--add-on",
                str(head), "--prompt", "t1 t2", "--max-new-tokens", "6", "--exit-layer", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["metrics"]["new_tokens"] == 6 and out["metrics"]["hit_rate"] is not None
