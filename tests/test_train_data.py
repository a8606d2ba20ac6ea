"""Distillation data: prompts reproducible from a seed (corpora: all six categories; self-instruct:
written by the target), none from the bench set; batched greedy answers equal transformers' generate."""
import json

import pytest

from mirror_sd.tools.bench import DEFAULT_PROMPTS
from mirror_sd.train.data import encode_prompt
from mirror_sd.train.distill import load_target
from mirror_sd.train.generate import _generate_batch, _generate_batch_hf
from mirror_sd.train.instruct import rejection, resume_point, self_instruct_prompts, user_turn_prefix
from mirror_sd.train.prompts import CATEGORIES, BenchFilter, build_prompts


@pytest.mark.slow  # training prompts built from the corpora (about 20 s): make test-all
def test_prompts_are_reproducible_cover_every_category_and_avoid_the_bench_set():
    prompts = build_prompts(24, seed=0)
    assert prompts == build_prompts(24, seed=0)
    assert prompts != build_prompts(24, seed=1)
    assert {p["category"] for p in prompts} == set(CATEGORIES)
    assert all(p["source"] and p["messages"] and p["messages"][0]["role"] == "user" for p in prompts)
    bench_texts = [t for line in DEFAULT_PROMPTS.read_text().splitlines()
                   for t in (json.loads(line).get("turns") or [json.loads(line)["prompt"]])]
    users = [m["content"] for p in prompts for m in p["messages"] if m["role"] == "user"]
    assert not any(b in u or u in b for b in bench_texts for u in users)


@pytest.fixture(scope="module")
def hf_target():
    _, model, tokenizer = load_target(threads=2)
    return model, tokenizer


def test_batched_greedy_answers_equal_transformers_generate(hf_target):
    model, tokenizer = hf_target
    prompts = [encode_prompt(tokenizer, [{"role": "user", "content": text}])
               for text in ("Name a colour.", "What is two plus two? Answer in one word.", "Say hello.")]
    ours = _generate_batch(model, tokenizer, prompts, max_new_tokens=12)
    assert ours == _generate_batch_hf(model, tokenizer, prompts, max_new_tokens=12)
    assert all(0 < len(a) <= 12 for a in ours)


@pytest.mark.slow  # training data, sampled with the real target: make test-all
def test_self_instruct_prompts_are_reproducible_single_user_turns_and_avoid_the_bench_set(hf_target):
    model, tokenizer = hf_target
    prefix = tokenizer.decode(user_turn_prefix(tokenizer))
    assert prefix.endswith("<|im_start|>user\n") and "<|im_start|>system" in prefix
    stats = {}
    prompts = self_instruct_prompts(model, tokenizer, 2, seed=0, stats=stats, round_size=4)
    assert prompts == self_instruct_prompts(model, tokenizer, 2, seed=0, round_size=4)
    assert prompts != self_instruct_prompts(model, tokenizer, 2, seed=1, round_size=4)
    assert [p["id"] for p in prompts] == [f"instruction-{k:06d}" for k in range(1, 3)]
    bench = BenchFilter()
    for p in prompts:
        assert [m["role"] for m in p["messages"]] == ["user"]
        text = p["messages"][0]["content"]
        assert 4 <= len(text.split()) <= 80 and not bench.overlaps(text)
    assert stats["sampled"] >= 2 + sum(v for k, v in stats.items() if k.startswith("dropped_"))


@pytest.mark.slow
def test_self_instruct_sampling_goes_on_from_an_earlier_run_as_if_run_from_scratch(hf_target):
    model, tokenizer = hf_target
    whole = self_instruct_prompts(model, tokenizer, 4, seed=0, round_size=3)
    assert self_instruct_prompts(model, tokenizer, 4, seed=0, round_size=3, earlier=whole[:2]) == whole
    assert resume_point([dict(ref="seed 0, round 4, sample 2")], 0, round_size=3) == (5, 0)
    assert resume_point([dict(ref="seed 0, round 4, sample 1")], 0, round_size=3) == (4, 2)
    with pytest.raises(ValueError, match="seed 1"):
        resume_point(whole, 1, round_size=3)


def test_self_instruct_rejects_unfinished_duplicate_and_bench_text():
    bench, seen = BenchFilter(), {"can you help me plan a party"}
    assert rejection("Can you help me plan a trip?", True, bench, seen) is None
    assert rejection("Can you help me plan a trip?", False, bench, seen) == "dropped_unfinished"
    assert rejection("Can you help me plan a party?", True, bench, seen) == "dropped_duplicate"
    assert rejection("Hi", True, bench, seen) == "dropped_length"
    assert rejection("Translate to English: Le chat dort sur le canapé.", True, bench, seen) == "dropped_bench_overlap"


def test_data_readme_lists_the_categories_present_and_mentions_turns_only_for_multi_turn_data(tmp_path):
    from types import SimpleNamespace

    from mirror_sd.train.distill import _write_reports

    eos = 2
    tokenizer = SimpleNamespace(eos_token_id=eos)
    args = SimpleNamespace(source="self-instruct", seed=0, num_prompts=2, max_new_tokens=8, batch_size=2, threads=1,
                           device="cpu", round_size=64, sampler="multinomial", target=None)
    prompts = [dict(id=f"instruction-{i}", category="instruction", source="self-instruct",
                    messages=[{"role": "user", "content": "Name a colour."}]) for i in (1, 2)]
    rows = [dict(id=p["id"], category="instruction", prompt_ids=[5, 6], answer_ids=[7, eos]) for p in prompts]
    _write_reports(tmp_path, args, prompts, rows, {}, 1.0, 4, tokenizer, "target")
    readme = (tmp_path / "README.md").read_text()
    assert "| instruction | 2 | 2 | 4 | 4 | 0 |" in readme and "| qa |" not in readme
    assert "Multi-turn" not in readme and readme.startswith("# Distillation data for SmolLM2-135M-Instruct")

    two_turns = [{"role": "user", "content": "Hi."}, {"role": "assistant", "content": None},
                 {"role": "user", "content": "And?"}]
    prompts = [dict(id="multi-turn-1", category="multi-turn", source="chitchat-dataset", messages=two_turns)]
    rows = [dict(id=f"multi-turn-1/t{k}", category="multi-turn", prompt_ids=[5], answer_ids=[7]) for k in (1, 2)]
    _write_reports(tmp_path, SimpleNamespace(**{**vars(args), "source": "corpora"}), prompts, rows, {}, 1.0, 2, tokenizer, "t")
    readme = (tmp_path / "README.md").read_text()
    assert "| multi-turn | 1 | 2 | 2 | 2 | 2 |" in readme and "Multi-turn prompts are answered turn by turn" in readme


def test_reference_data_pairs_each_prompt_with_corpus_text_and_tokenizes_like_the_distilled_data(tmp_path):
    from transformers import AutoTokenizer

    from mirror_sd.models.loading import embedded_model_dir
    from mirror_sd.train.reference import CATEGORIES as REF_CATEGORIES, build_reference_prompts, reference_rows

    prompts = build_reference_prompts(18, seed=0)
    assert prompts == build_reference_prompts(18, seed=0)
    assert build_reference_prompts(12, seed=0) == [p for p in prompts if int(p["id"][-6:]) <= 2]  # a prefix per category
    assert {p["category"] for p in prompts} == set(REF_CATEGORIES)
    bench = BenchFilter()
    for p in prompts:
        users = [m["content"] for m in p["messages"] if m["role"] == "user"]
        assert len(p["answers"]) == len(users) and all(a.strip() for a in p["answers"])
        assert not any(bench.overlaps(t) for t in users + p["answers"])
        if p["category"] == "math":
            assert p["answers"][0].endswith(f"The answer is {p['answer']}.") and "####" not in p["answers"][0]
        if p["category"] in ("summarization", "rag"):   # the lead sentence of the passage in the prompt
            first = p["answers"][0].removeprefix("- ").split("\n")[0].split(". ")[0]
            assert first in users[0]
        if p["category"] == "multi-turn":
            assert p["messages"][1] == {"role": "assistant", "content": p["answers"][0]}

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir())
    multi = next(p for p in prompts if p["category"] == "multi-turn")
    rows = reference_rows([multi], tokenizer, max_answer_tokens=512)
    assert [r["id"] for r in rows] == [multi["id"] + "/t1", multi["id"] + "/t2"]
    # turn 2's prompt + answer is the chat template of the whole conversation with both answers
    whole = multi["messages"] + [{"role": "assistant", "content": multi["answers"][1]}]
    templated = tokenizer.apply_chat_template(whole, tokenize=True, return_dict=True)["input_ids"]
    assert list(templated[:len(rows[1]["prompt_ids"]) + len(rows[1]["answer_ids"])]) == rows[1]["prompt_ids"] + rows[1]["answer_ids"]
    assert rows[0]["answer_ids"][-1] == tokenizer.eos_token_id
    assert rows[1]["prompt_ids"][:len(rows[0]["prompt_ids"])] == rows[0]["prompt_ids"]
    cut = reference_rows([multi], tokenizer, max_answer_tokens=4)
    assert all(len(r["answer_ids"]) == 4 and r["answer_ids"][-1] != tokenizer.eos_token_id for r in cut)


def test_data_on_a_device_this_machine_lacks_is_a_clear_error(tmp_path, capsys):
    import torch

    from mirror_sd.train.__main__ import main

    if torch.cuda.device_count() > 3:
        pytest.skip("this machine has a cuda:3")
    rc = main(["data", "--out", str(tmp_path), "--num-prompts", "2", "--device", "cuda:3"])
    assert rc == 2 and "device 'cuda:3' is not available" in capsys.readouterr().err


@pytest.mark.slow  # training data, sampled with the real target: make test-all
def test_prompts_only_then_answers_them_where_the_corpora_are_missing(tmp_path, monkeypatch):
    """--prompts-only writes the prompts and stops; the same command without it reads them back
    (here with the corpora made unreachable, as on a GPU box) and writes one answer per turn."""
    from mirror_sd.train import prompts as P
    from mirror_sd.train.__main__ import main

    command = ["data", "--out", str(tmp_path), "--num-prompts", "6", "--max-new-tokens", "3", "--threads", "1"]
    assert main(command + ["--prompts-only"]) == 0
    assert not (tmp_path / "data.jsonl").exists()
    built = [json.loads(line) for line in (tmp_path / "prompts.jsonl").read_text().splitlines()]
    assert built == build_prompts(6, seed=0)

    def no_corpora(*args, **kwargs):
        raise RuntimeError("corpus package is not installed")

    monkeypatch.setattr(P, "build_prompts", no_corpora)
    assert main(command) == 0
    rows = [json.loads(line) for line in (tmp_path / "data.jsonl").read_text().splitlines()]
    turns = sum(m["role"] == "user" for p in built for m in p["messages"])
    assert len(rows) == turns and all(0 < len(r["answer_ids"]) <= 3 for r in rows)
    dropped = {}
    build_prompts(6, seed=0, stats=dropped)
    reported = json.loads((tmp_path / "sources.json").read_text())["filter"]  # also in the README's line
    assert dropped and reported == {**dropped, "read_from": str(tmp_path / "prompts.jsonl")}
    assert main(command[:2] + [str(tmp_path), "--num-prompts", "6", "--max-new-tokens", "4"]) == 2  # other settings: refused


@pytest.mark.parametrize("method", ["multinomial", "inverse-cdf"])
def test_self_instruct_samplers_draw_each_token_with_its_probability_and_are_seeded(method):
    """Both samplers (train/generate.sampler) against a known law: zero-probability tokens never come,
    and the counts pass a chi-square test (p > 0.001); the same seed gives the same draws."""
    import torch
    from scipy.stats import chisquare

    from mirror_sd.train.generate import sampler

    probs = torch.tensor([0.5, 0.0, 0.2, 0.25, 0.0, 0.05])
    logits = probs.log().expand(20000, -1)  # [20000, 6]: one draw per row
    draws = sampler(torch.Generator().manual_seed(0), method)(logits)
    counts = torch.bincount(draws, minlength=len(probs))
    assert counts[probs == 0].sum() == 0
    kept = probs > 0
    assert chisquare(counts[kept].numpy(), (probs[kept] * len(draws)).numpy()).pvalue > 1e-3
    assert torch.equal(draws, sampler(torch.Generator().manual_seed(0), method)(logits))


@pytest.mark.parametrize("option, refused", [("--round-size=512", "round_size=64"),
                                             ("--sampler=inverse-cdf", "sampler=multinomial")])
def test_a_folder_keeps_its_self_instruct_round_size_and_sampler(option, refused, tmp_path, capsys):
    """Both are part of what a seed samples, so resuming a folder with others is refused."""
    from mirror_sd.train.__main__ import main

    (tmp_path / "config.json").write_text(json.dumps(dict(source="self-instruct", seed=0, max_new_tokens=192)))
    (tmp_path / "prompts.jsonl").write_text("")  # a folder from before both options: rounds of 64, multinomial
    rc = main(["data", "--out", str(tmp_path), "--source", "self-instruct", "--num-prompts", "2", option])
    assert rc == 2 and refused in capsys.readouterr().err
