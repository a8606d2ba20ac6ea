"""Distillation prompts: reproducible from a seed, all six categories, none from the bench set."""
import json

from mirror_sd.bench import DEFAULT_PROMPTS
from mirror_sd.train.prompts import CATEGORIES, build_prompts


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
