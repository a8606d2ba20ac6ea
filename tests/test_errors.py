"""Bad input gets a clear MirrorSDError, and failures mid-run keep what was generated."""
import json

import pytest
import torch

from mirror_sd import MirrorSDError, generate, load_pair, stream


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt=""), "prompt is empty"),
    (dict(prompt="   \n "), "prompt is empty"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(max_new_tokens=-3), "max_new_tokens"),
    (dict(max_new_tokens=2.5), "max_new_tokens"),
    (dict(gamma=0), "gamma"),
    (dict(gamma=1000), "gamma"),
    (dict(gamma=2.5), "gamma"),
    (dict(temperature=-1.0), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(seed=-1), "seed"),
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(method="vanilla", gamma=3), "takes no options"),
    (dict(kappa=3), "takes gamma"),
])
def test_bad_generation_settings(tiny_pair, kwargs, message):
    args = dict(prompt="t1 t2", method="sd", max_new_tokens=4, raw=True) | kwargs
    with pytest.raises(MirrorSDError, match=message):
        generate(tiny_pair, **args)


def test_prompt_longer_than_the_context(tiny_pair):
    with pytest.raises(MirrorSDError, match="does not fit the target's context of 256"):
        generate(tiny_pair, "t1 " * 300, raw=True, max_new_tokens=4)


def test_unknown_and_invalid_model_names():
    with pytest.raises(MirrorSDError, match="could not fetch 'no-such-org/no-such-model'"):
        load_pair(target="no-such-org/no-such-model")
    with pytest.raises(MirrorSDError, match="unknown model"):
        load_pair(target="not a model id/with spaces/")


def test_unsupported_architecture_lists_what_is_supported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(MirrorSDError, match="'gpt2' is not supported.*llama, mistral, qwen2, qwen3"):
        load_pair(target=str(tmp_path), draft=None)


def test_pickle_checkpoints_are_refused(tiny_dirs, tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    (folder / "config.json").write_text((tiny_dirs["target"] / "config.json").read_text())
    torch.save({}, folder / "pytorch_model.bin")
    with pytest.raises(MirrorSDError, match="pickle checkpoints"):
        load_pair(target=str(folder), draft=None)


def test_draft_with_another_vocabulary_is_refused(tiny_dirs):
    with pytest.raises(MirrorSDError, match="tokenizer differs"):
        load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["other_vocab"]))


def test_bad_self_draft_and_dtype(tiny_dirs):
    with pytest.raises(MirrorSDError, match="self:N"):
        load_pair(target=str(tiny_dirs["target"]), draft="self:9")
    with pytest.raises(MirrorSDError, match="unknown dtype"):
        load_pair(target=str(tiny_dirs["target"]), draft=None, dtype="fp8")


def test_method_needing_a_draft_without_one(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=None)
    with pytest.raises(MirrorSDError, match="needs a draft"):
        generate(pair, "t1", method="sd", raw=True)


def test_device_failure_mid_run_keeps_generated_tokens(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))
    reference = generate(pair, "t1 t2", method="vanilla", max_new_tokens=20, raw=True).token_ids
    calls = {"n": 0}
    forward = pair.draft.forward

    def failing_forward(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 8:
            raise RuntimeError("device lost")
        return forward(*args, **kwargs)

    pair.draft.forward = failing_forward
    out = generate(pair, "t1 t2", method="sd", max_new_tokens=20, raw=True, gamma=3)
    assert out.finished == "error"
    assert "device lost" in out.error and "RuntimeError" in out.error
    assert 0 < len(out.token_ids) < 20
    assert out.token_ids == reference[:len(out.token_ids)]  # nothing committed is lost or wrong


def test_stopping_a_stream_keeps_the_text_so_far(tiny_pair):
    outputs = []
    gen = stream(tiny_pair, "t1 t2", method="sd", max_new_tokens=40, raw=True, gamma=2)
    for out in gen:
        outputs.append(out)
        if len(outputs) == 3:
            gen.close()  # the user pressed stop
            break
    assert outputs[-1].token_ids and outputs[-1].finished == "running"
    again = generate(tiny_pair, "t1 t2", method="sd", max_new_tokens=40, raw=True, gamma=2)
    assert again.token_ids[:len(outputs[-1].token_ids)] == outputs[-1].token_ids


def test_other_targets_get_no_default_draft(tiny_dirs):
    pair = load_pair(target=str(tiny_dirs["target"]))
    assert pair.draft is None
    with pytest.raises(MirrorSDError, match="needs a draft model: pass one"):
        generate(pair, "t1", method="mirror", raw=True)
