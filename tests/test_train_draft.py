"""Draft training: a short run on a tiny model lowers the held-out loss, and the result loads."""
import json

import pytest
import torch

from mirror_sd import generate, load_pair
from mirror_sd.errors import MirrorSDError
from mirror_sd.train.draft import IGNORE, build_vocab_map, data_folders, read_examples, target_labels, train
from mirror_sd.train.features import extract_features, load_sequences


def _distilled_data(tiny_pair, folder, n=48):
    """The tiny target's own greedy answers to random prompts, in the data subcommand's format."""
    gen = torch.Generator().manual_seed(0)
    lines = []
    for i in range(n):
        prompt = " ".join(f"t{int(t)}" for t in torch.randint(0, 16, (4,), generator=gen))
        out = generate(tiny_pair, prompt, method="vanilla", max_new_tokens=24, raw=True)
        lines.append(json.dumps(dict(id=str(i), category="qa", source="test", prompt_ids=tiny_pair.encode(prompt, raw=True),
                                     answer_ids=out.token_ids)))
    folder.mkdir()
    (folder / "data.jsonl").write_text("\n".join(lines))
    return folder


def test_short_training_run_lowers_the_loss_and_loads(tiny_dirs, tiny_pair, tmp_path):
    data = _distilled_data(tiny_pair, tmp_path / "data")
    out = tmp_path / "draft"
    card = train(data, out, layers=[0], vocab_size=12, epochs=30, lr=3e-3, batch_tokens=512, eval_every=10,
                 holdout=0.2, threads=1, target_dir=tiny_dirs["target"])
    history = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in history if "eval_loss" in h]
    assert evals[-1] < 0.8 * evals[0]
    assert (out / "loss.png").stat().st_size > 0 and card["head_vocabulary"] == 12 and card["data"] == ["data"]
    assert card["data_sources"] == ["corpora"] and "prompts built from offline corpora" in (out / "README.md").read_text()
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(out))  # borrows the target's embedding
    assert pair.draft.vocab_map.numel() == 12 and pair.draft.num_layers == 1
    vanilla = generate(pair, "t3 t1 t4", method="vanilla", max_new_tokens=16, raw=True).token_ids
    assert generate(pair, "t3 t1 t4", method="sd", max_new_tokens=16, raw=True, gamma=3).token_ids == vanilla


def test_vocab_map_keeps_the_most_frequent_tokens_and_always_eos():
    examples = [([1], [5, 5, 5, 7, 7, 9]), ([2], [5, 7, 3])]
    assert build_vocab_map(examples, 3, {0}).tolist() == [0, 5, 7]


def test_target_labels_are_the_targets_argmax_at_every_position(tiny_dirs, tiny_pair, tmp_path):
    """--labels target: prompt positions are labelled too, each with the target's own next-token choice."""
    data = _distilled_data(tiny_pair, tmp_path / "data", n=24)
    examples = read_examples(data)
    vocab_map = torch.arange(16)
    seqs = load_sequences(extract_features(tiny_pair.target, examples, tmp_path / "features", max_len=64), feats=False)
    for (prompt, answer), (ids, labels) in zip(examples, target_labels(seqs, vocab_map)):
        assert ids == prompt + answer and labels[-1] == IGNORE
        logits = tiny_pair.target(torch.tensor([ids]), None)[0]  # [L, V], causal, no cache
        assert labels[:-1] == logits.argmax(-1)[:-1].tolist()
        assert labels[len(prompt) - 1:len(ids) - 1] == answer  # on answers: the greedy tokens themselves

    out = tmp_path / "draft"
    card = train(data, out, layers=[0], vocab_size=12, epochs=20, lr=3e-3, batch_tokens=512, eval_every=10,
                 holdout=0.2, threads=1, target_dir=tiny_dirs["target"], labels="target", features=tmp_path / "features")
    evals = [h["eval_loss"] for h in json.loads((out / "metrics.json").read_text()) if "eval_loss" in h]
    assert evals[-1] < 0.8 * evals[0]
    assert card["labels"] == "target" and card["labelled_tokens"] > 0


def test_several_data_folders_are_read_in_order(tmp_path):
    for name, n in (("a", 2), ("b", 3)):
        (tmp_path / name).mkdir()
        rows = [dict(id=f"{name}{i}", prompt_ids=[i], answer_ids=[i, 7]) for i in range(n)]
        (tmp_path / name / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn')
    a, b = tmp_path / "a", tmp_path / "b"
    assert read_examples([a, b]) == read_examples(a) + read_examples(b)
    assert read_examples([a, b]) == [([0], [0, 7]), ([1], [1, 7]), ([0], [0, 7]), ([1], [1, 7]), ([2], [2, 7])]
    assert [d.name for d in data_folders([a, b])] == ["a", "b"] and data_folders(a) == [a]
    (b / "config.json").write_text(json.dumps({"source": "reference", "seed": 0}))
    assert read_examples([a, b]) == read_examples([a, b], targets_answers=False)  # eagle reads any text
    with pytest.raises(MirrorSDError, match="reference answers"):  # the draft and streams learn answer tokens
        read_examples([a, b], targets_answers=True)
    from mirror_sd.train.__main__ import main
    assert main(["ss", "--data", str(a), str(b), "--out", str(tmp_path / "streams")]) == 2


def test_feature_shards_are_shared_by_equal_examples_only(tiny_pair, tmp_path):
    """One cache serves every data set: a shard is reused for the same examples, never for others."""
    a = [([1, 2, 3], [4, 5]), ([6, 7], [8])]
    b = [([1, 2, 3], [4, 6]), ([6, 7], [8])]  # same count and lengths, one token differs
    folder = tmp_path / "features"
    shards_a = extract_features(tiny_pair.target, a, folder, max_len=64)
    shards_b = extract_features(tiny_pair.target, b, folder, max_len=64)
    assert shards_a != shards_b
    assert [s["ids"].tolist() for s in load_sequences(shards_b, feats=False)] == [p + q for p, q in b]
    written = shards_a[0].stat().st_mtime_ns
    assert extract_features(tiny_pair.target, a, folder, max_len=64) == shards_a
    assert shards_a[0].stat().st_mtime_ns == written and not list(folder.glob("*.partial"))


def test_training_on_a_device_this_machine_lacks_is_a_clear_error(tiny_dirs, tmp_path):
    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a cuda:3")
    with pytest.raises(MirrorSDError, match="device 'cuda:3' is not available"):
        train(tmp_path, tmp_path / "draft", [0], target_dir=tiny_dirs["target"], device="cuda:3")


def test_bad_layers_are_clear_errors(tiny_dirs, tmp_path, capsys):
    """Layers the target lacks fail before any work, and the command line refuses non-numbers."""
    from mirror_sd.train.__main__ import main

    with pytest.raises(MirrorSDError, match=r"--layers must name target layers in 0\.\.1"):
        train(tmp_path, tmp_path / "draft", [0, 2], target_dir=tiny_dirs["target"])
    for command in (["draft", "--layers", "a,b"], ["eagle", "--early-layers", "x"]):
        with pytest.raises(SystemExit) as exit_:
            main([*command, "--data", str(tmp_path), "--out", str(tmp_path / "out")])
        assert exit_.value.code == 2  # argparse: one line naming the option
        assert "expected comma-separated layer numbers" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["data", "--num-prompts", "0"], ["data", "--num-prompts", "4", "--batch-size", "-2"],
    ["draft", "--epochs", "0"], ["draft", "--lr", "nan"], ["draft", "--batch-tokens", "x"],
    ["eagle", "--vocab", "0"], ["eagle", "--unroll", "0"], ["eagle", "--noise", "-1"], ["eagle", "--epochs", "inf"],
    ["ss", "--streams", "0"], ["ss", "--rank", "-1"], ["ss", "--positions", "0"],
])
def test_training_commands_refuse_bad_numbers_in_one_line(command, tmp_path, capsys):
    from mirror_sd.train.__main__ import main

    data = [] if command[0] == "data" else ["--data", str(tmp_path)]
    with pytest.raises(SystemExit) as exit_:
        main([*command, *data, "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and f"argument {command[-2]}: expected" in err and "Traceback" not in err


def test_a_missing_data_folder_is_a_clear_error(tmp_path, capsys):
    from mirror_sd.train.__main__ import main

    assert main(["eagle", "--data", str(tmp_path / "none"), "--out", str(tmp_path / "out")]) == 2
    assert "no data.jsonl in" in capsys.readouterr().err
