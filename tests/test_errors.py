"""Bad input gets a clear MirrorSDError, and failures mid-run keep what was generated."""
import json
from pathlib import Path

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
    (dict(seed=2**64, temperature=0.7), "seed must be an integer from 0 to 2\\*\\*63 - 1"),
    (dict(prompt=42), "a prompt is a string or a list of chat messages"),
    (dict(prompt=[{"role": "user"}]), "a prompt is a string or a list of chat messages"),
    (dict(method="nope"), "unknown method 'nope'"),
    (dict(method="vanilla", gamma=3), "takes no options"),
    (dict(kappa=3), "takes gamma"),
    (dict(temperature=0.7, tree=4), "method 'sd': tree works at temperature 0 only"),
    (dict(method="mirror", temperature=0.7, lookup=4), "lookup works at temperature 0 only"),
    (dict(method="mirror", queued=1), "got queued"),  # settled switches, now rules (docs/experiments/mirror.md)
])
def test_bad_generation_settings(tiny_pair, kwargs, message):
    args = dict(prompt="t1 t2", method="sd", max_new_tokens=4, raw=True) | kwargs
    with pytest.raises(MirrorSDError, match=message):
        generate(tiny_pair, **args)


def test_prompt_longer_than_the_context(tiny_pair):
    with pytest.raises(MirrorSDError, match="does not fit the target's context of 256"):
        generate(tiny_pair, "t1 " * 300, raw=True, max_new_tokens=4)


def test_a_sliding_window_model_is_kept_inside_its_window(tiny_dirs, tmp_path):
    """Mistral attends to its last sliding_window tokens only; this forward attends to every token, so it
    decodes only while the whole sequence fits the window."""
    from conftest import make_tiny_model

    folder = make_tiny_model(tmp_path / "mistral", seed=1, model_type="mistral")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"sliding_window": 80}))
    pair = load_pair(target=str(folder), draft=None)
    assert generate(pair, "t1 t2", method="vanilla", max_new_tokens=8, raw=True).error is None
    with pytest.raises(MirrorSDError, match="sliding attention window of 80 tokens"):
        generate(pair, "t1 t2", method="vanilla", max_new_tokens=20, raw=True)


def broken_copy(tiny_dirs, tmp_path, name: str) -> Path:
    """A copy of the tiny target's folder, to break."""
    import shutil

    return Path(shutil.copytree(tiny_dirs["target"], tmp_path / name))


def test_a_broken_model_folder_gets_one_clear_error(tiny_dirs, tmp_path):
    bad_json = broken_copy(tiny_dirs, tmp_path, "bad-json")
    (bad_json / "config.json").write_text("{not json")
    no_tokenizer = broken_copy(tiny_dirs, tmp_path, "no-tokenizer")
    for f in no_tokenizer.glob("tokenizer*"):
        f.unlink()
    truncated = broken_copy(tiny_dirs, tmp_path, "truncated")
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    misshapen = broken_copy(tiny_dirs, tmp_path, "misshapen")
    config = json.loads((misshapen / "config.json").read_text())
    (misshapen / "config.json").write_text(json.dumps(config | {"intermediate_size": 48}))
    cases = [(bad_json, "could not be read as JSON"), (no_tokenizer, "its tokenizer could not be loaded"),
             (truncated, "not a readable safetensors file"), (misshapen, "its weights do not match its config.json")]
    for folder, message in cases:
        with pytest.raises(MirrorSDError, match=message):
            load_pair(target=str(folder), draft=None)


@pytest.mark.parametrize("flags,message", [({"attention_bias": True}, "attention_bias"),
                                           ({"mlp_bias": True}, "mlp_bias")])
def test_llama_biases_the_forward_has_no_place_for_are_refused_by_name(tiny_dirs, tmp_path, flags, message):
    folder = broken_copy(tiny_dirs, tmp_path, "biased")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | flags))
    with pytest.raises(MirrorSDError, match=f"{message}.*not supported"):
        load_pair(target=str(folder), draft=None)


def test_a_paused_stream_refuses_a_second_generation_in_its_thread_instead_of_hanging(tiny_pair):
    paused = stream(tiny_pair, "t1 t2", method="vanilla", max_new_tokens=8, raw=True)
    next(paused)
    with pytest.raises(MirrorSDError, match="still decoding a stream"):
        generate(tiny_pair, "t1", method="vanilla", max_new_tokens=2, raw=True)
    paused.close()
    assert generate(tiny_pair, "t1", method="vanilla", max_new_tokens=2, raw=True).error is None


def test_a_stream_yields_its_last_output_once(tiny_pair):
    outputs = list(stream(tiny_pair, "t1 t2", method="sd", max_new_tokens=8, raw=True, gamma=2))
    assert [o.finished for o in outputs].count("running") == len(outputs) - 1 and outputs[-1].finished == "length"
    assert len(outputs) == len(outputs[-1].trace.steps)  # one Output per step, the prefill's first token too


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


def test_target_failure_mid_run_keeps_generated_tokens(tiny_pair, monkeypatch):
    reference = generate(tiny_pair, "t1 t2", method="vanilla", max_new_tokens=20, raw=True).token_ids
    calls = {"n": 0}
    forward_layers = tiny_pair.target.forward_layers

    def failing(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] > 6:
            raise RuntimeError("device lost")
        return forward_layers(*args, **kwargs)

    monkeypatch.setattr(tiny_pair.target, "forward_layers", failing)
    out = generate(tiny_pair, "t1 t2", method="sd", max_new_tokens=20, raw=True, gamma=3)
    assert out.finished == "error" and out.note is None
    assert "device lost" in out.error and "RuntimeError" in out.error
    assert 0 < len(out.token_ids) < 20
    assert out.token_ids == reference[:len(out.token_ids)]  # nothing committed is lost or wrong


def fail_draft_lane_at(monkeypatch, pair, step: int):
    """From decoding step ``step`` on, work submitted to the pair's draft lane raises, as a device would."""
    submit = pair.draft_lane.submit

    def broken(*args, **kwargs):
        raise RuntimeError("draft device lost")

    def failing(kind, fn, *args, **kwargs):
        return submit(kind, broken if kwargs.get("step", 0) >= step else fn, *args, **kwargs)

    monkeypatch.setattr(pair.draft_lane, "submit", failing)


@pytest.mark.parametrize("method,options", [("sd", dict(gamma=3)), ("mirror", dict(gamma=2, kappa=2))])
@pytest.mark.parametrize("step", [0, 3])
def test_a_failed_draft_lane_finishes_target_only_with_vanillas_text(tiny_pair, monkeypatch, method, options, step):
    reference = generate(tiny_pair, "t1 t2", method="vanilla", max_new_tokens=20, raw=True)
    fail_draft_lane_at(monkeypatch, tiny_pair, step)
    out = generate(tiny_pair, "t1 t2", method=method, max_new_tokens=20, raw=True, **options)
    assert out.error is None and out.finished == "length"
    assert out.token_ids == reference.token_ids and out.text == reference.text
    assert out.note.startswith(f"draft lane failed at step {step}: RuntimeError: draft device lost; finished target-only")
    assert out.trace.meta["note"] == out.note  # recorded traces keep it
    assert any(s.kind == "prefill" and "target only" in s.label for s in out.trace.spans)


def test_a_failed_draft_lane_at_temperature_above_zero_still_finishes(tiny_pair, monkeypatch):
    fail_draft_lane_at(monkeypatch, tiny_pair, 2)
    out = generate(tiny_pair, "t1 t2", method="mirror", max_new_tokens=12, raw=True, temperature=0.8, gamma=2)
    assert out.error is None and len(out.token_ids) == 12 and out.note


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


def test_the_apps_card_shows_the_note(tiny_pair, monkeypatch):
    from app.cards import card_html
    from app.race import Result

    fail_draft_lane_at(monkeypatch, tiny_pair, 1)
    out = generate(tiny_pair, "t1 t2", method="sd", max_new_tokens=6, raw=True, gamma=2)
    card = card_html(Result("sd", out.trace, out.metrics, out.finished))
    assert 'class="card-note"' in card and "draft lane failed at step 1" in card
