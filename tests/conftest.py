"""Shared fixtures: tiny random Llama-family models built here, and the embedded target."""
from __future__ import annotations

import os
import json
from pathlib import Path

import pytest
import torch

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
if not torch.cuda.is_available():  # Triton's interpreter runs models/fused.py's kernels on CPU tensors
    os.environ.setdefault("TRITON_INTERPRET", "1")  # (read when Triton is first imported)

from mirror_sd import load_pair  # noqa: E402
from mirror_sd.models import auto_dtype  # noqa: E402
from mirror_sd.tools.bench import DEFAULT_PROMPTS, read_prompts  # noqa: E402

TINY_VOCAB = 16
read_native_bf16 = auto_dtype.native_bf16  # the real reader, before the suite hides the flag
NATIVE_BF16 = read_native_bf16()  # this CPU's native bf16 flag (amx_bf16, avx512_bf16) or None
needs_native_bf16 = pytest.mark.skipif(NATIVE_BF16 is None, reason="this CPU has no native bf16 (no amx_bf16 or "
                                       "avx512_bf16 flag): exact bf16 is checked where dtype='auto' can pick it")


@pytest.fixture(scope="session", autouse=True)
def fp32_unless_asked():
    """dtype="auto" (the default) picks fp32 in the suite, as on a CPU without native bf16, so the
    tests run as they always have on every machine; the bf16 tests ask for bf16 by name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(auto_dtype, "native_bf16", lambda cpuinfo=None: None)
        yield


def pytest_addoption(parser):
    parser.addoption("--full", action="store_true",
                     help="also run the slow variants: the chi-square test of every option, and the equality "
                          "tests on 4 prompts per category instead of 2 (make test-all)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a variant that only `pytest --full` (make test-all) runs")


def pytest_collection_modifyitems(config, items):
    """Without --full, tests marked slow are skipped: the default run stays under 15 minutes."""
    if config.getoption("--full"):
        return
    skip = pytest.mark.skip(reason="a slow variant: make test-all (pytest --full) runs it")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


def pytest_terminal_summary(terminalreporter):
    """Say plainly which tests were skipped and why (the browser tests need Debian's Chromium)."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        return
    terminalreporter.section("skipped tests")
    slow = 0
    for report in skipped:
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "slow variant" in reason:
            slow += 1
        else:
            terminalreporter.write_line(f"SKIPPED {report.nodeid}: {reason.removeprefix('Skipped: ')}")
    if slow:
        terminalreporter.write_line(f"SKIPPED {slow} slow variants: make test-all (pytest --full) runs them too.")
    if any("Chromium" in str(report.longrepr) for report in skipped):
        terminalreporter.write_line("To run the browser tests: apt-get install chromium (as .ci/run does), then make test.")



def make_tokenizer(vocab_size: int, prefix: str = "t"):
    """A word-level tokenizer over words t0 .. t{V-1} (no special tokens, no chat template)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"{prefix}{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token=f"{prefix}0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=f"{prefix}0")


def make_tiny_model(folder: Path, seed: int, model_type: str = "llama", vocab_size: int = TINY_VOCAB,
                    tokenizer_prefix: str = "t", logit_std: float = 1.5) -> Path:
    """Save a random HF model of ``model_type`` with a word-level tokenizer into ``folder``.

    logit_std scales the LM head so logits have roughly that spread: distributions far from
    uniform yet not one-hot, so a statistical test sees the difference between target and draft.
    """
    import transformers

    config_cls = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
                  "qwen3": transformers.Qwen3Config, "mistral": transformers.MistralConfig}[model_type]
    config = config_cls(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                        tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None)
    if model_type == "qwen3":
        config.head_dim = 8
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config).float().eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_std / (model.lm_head.weight.std() * config.hidden_size ** 0.5))
        for name, p in model.named_parameters():  # random biases/norms, so every weight matters
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(folder)
    make_tokenizer(vocab_size, tokenizer_prefix).save_pretrained(folder)
    return folder


def reduce_head_vocabulary(folder: Path, keep_ids: list[int]) -> Path:
    """Cut a saved model's LM head down to ``keep_ids`` and store the vocab_map beside it."""
    from safetensors.torch import load_file, save_file

    from mirror_sd.models.loading import VOCAB_MAP_KEY

    file = folder / "model.safetensors"
    state = load_file(file)
    state["lm_head.weight"] = state["lm_head.weight"][keep_ids].contiguous()
    state[VOCAB_MAP_KEY] = torch.tensor(keep_ids, dtype=torch.long)
    save_file(state, file, metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "target": make_tiny_model(root / "target", seed=1),
        "draft": make_tiny_model(root / "draft", seed=2),
        "reduced_draft": reduce_head_vocabulary(make_tiny_model(root / "reduced", seed=2), [0, 2, 3, 5, 7, 8, 11, 13]),
        "other_vocab": make_tiny_model(root / "other_vocab", seed=3, tokenizer_prefix="w"),
    }


@pytest.fixture(scope="session")
def tiny_pair(tiny_dirs):
    return load_pair(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]))


@pytest.fixture(scope="session")
def embedded_pair():
    """The embedded default pair: the target and the project's shipped draft."""
    return load_pair()


@pytest.fixture(scope="session")
def bf16_pair():
    """The embedded pair in exact bf16 (models/exact.py), where this CPU computes bf16 natively."""
    if NATIVE_BF16 is None:
        pytest.skip("this CPU has no native bf16")
    return load_pair(dtype="bf16")


@pytest.fixture(scope="session")
def bench_prompts() -> list[dict]:
    return read_prompts(DEFAULT_PROMPTS)


@pytest.fixture(scope="session")
def equality_prompts(bench_prompts, pytestconfig) -> list[str]:
    """Varied prompts: 2 from each Spec-Bench category (first turn only), 4 with --full."""
    per_category = 4 if pytestconfig.getoption("--full") else 2
    by_category: dict[str, list[str]] = {}
    for item in bench_prompts:
        by_category.setdefault(item["category"], []).append(item["turns"][0])
    return [p for prompts in by_category.values() for p in prompts[:per_category]]


EQUALITY_TOKENS = 24


@pytest.fixture(scope="session")
def vanilla_reference(embedded_pair, equality_prompts) -> list[list[int]]:
    """Vanilla's greedy tokens on every equality prompt: what every method must reproduce."""
    from mirror_sd import generate

    return [generate(embedded_pair, p, method="vanilla", max_new_tokens=EQUALITY_TOKENS).token_ids
            for p in equality_prompts]


def write_json(path: Path, data: dict):
    path.write_text(json.dumps(data))


def reference_branches(draft, top_ids, top_logp, window_logp, budget, parents=None):
    """Mirror-SD's branch rule by its definition, in Python lists (what mirror_sd/branches.py computes
    in tensors): the valid hypotheses (r, v, score), best first, ties in (r, rank) order, at most
    ``budget``. score(r, v) = the path's early-exit log-probs + log p(v at r); children of row r skipped."""
    parents = list(range(-1, len(draft) - 1)) if parents is None else parents
    path_logp, children = [0.0], [set() for _ in range(len(draft) + 1)]
    for i, (p, token) in enumerate(zip(parents, draft)):  # parents come first
        path_logp.append(path_logp[p + 1] + float(window_logp[i]))
        children[p + 1].add(token)
    hypotheses = [(r, v, path_logp[r] + lp) for r in range(len(draft) + 1)
                  for v, lp in zip(top_ids[r].tolist(), top_logp[r].tolist()) if v not in children[r]]
    return sorted(hypotheses, key=lambda h: -h[2])[:budget]


def channel_of(pair, cache, ids: list[int], exit_layer: int, kappa: int, head=None):
    """``mirror.token_channel`` over ``ids`` (the last committed token, then the window) written after
    the target cache's slots, on the plain forwards (or the cache's layer stages): (hidden [1, T, d],
    top ids [T, kappa], top log-probs [T, kappa], window log-probs [T - 1])."""
    from types import SimpleNamespace

    from mirror_sd.methods.mirror import Context, Settings, token_channel
    from mirror_sd.methods.mirror_rollouts import chain

    run = SimpleNamespace(pair=pair, sequence=[ids[0]])
    ctx = Context(run, None, cache, None, Settings(gamma=len(ids) - 1, kappa=kappa, exit_layer=exit_layer, budget=1),
                  head)
    hidden, channel = token_channel(ctx, chain(ids[1:]))
    return hidden, channel.top_ids, channel.top_logp, channel.window_logp


def valid_branches(draft, top_ids, top_logp, window_logp, budget, parents=None):
    """The branch rule's valid branches (mirror_sd/branches.py), read as a step reads them: ``Branch``es."""
    from mirror_sd.branches import BranchTable, choose_branches

    r, roots, scores, valid = choose_branches(draft, top_ids, top_logp, window_logp, budget, parents)
    return BranchTable(BranchTable.columns(r, roots, valid, scores)).read()
