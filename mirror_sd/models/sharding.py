"""A target too big for one GPU, sharded over several with an accelerate device map.

accelerate plans: ``infer_auto_device_map`` fills the devices in order, never splitting a decoder
layer, within each device's memory budget (it keeps room for one more layer on every device but the
last). The model then runs its layers on each device in turn
(``Transformer.forward_layers`` moves the hidden states at a device boundary) and keeps each
layer's KV cache on that layer's device (``ShardedKVCache``). Pipeline parallelism is not the
point: the devices work one after another, as one big device would.

Ask for it with a comma-separated device list (``--target-device cuda:0,cuda:1``); with no device
given, a target larger than the first GPU's free memory is sharded over every GPU on its own.
"""
from __future__ import annotations

import torch
from accelerate import infer_auto_device_map

from ..errors import MirrorSDError
from .llama import Transformer

HEADROOM = 0.85  # share of a GPU's free memory the weights may fill: the KV cache and activations need the rest


def weight_bytes(model: Transformer) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


def free_memory(device: torch.device) -> int:
    """Bytes a model may fill on ``device``: HEADROOM of the free memory of a CUDA GPU."""
    if device.type != "cuda":
        raise MirrorSDError(f"sharding needs CUDA GPUs; {device} is not one")
    free, _ = torch.cuda.mem_get_info(device)
    return int(free * HEADROOM)


def plan(model: Transformer, devices: list[torch.device], budgets: list[int]) -> dict[str, torch.device]:
    """accelerate's device map {module name: device}, within ``budgets`` bytes per device, in order."""
    device_map = infer_auto_device_map(model, max_memory={i: b for i, b in enumerate(budgets)},
                                       no_split_module_classes=["DecoderLayer"])
    places = set(device_map.values())
    if not places <= set(range(len(devices))):  # accelerate spills to "cpu"/"disk" when the GPUs are full
        need, have = weight_bytes(model) / 2**30, sum(budgets) / 2**30
        raise MirrorSDError(f"the target's weights ({need:.1f} GiB) do not fit on {', '.join(map(str, devices))} "
                            f"({have:.1f} GiB usable): add devices or use a smaller dtype")
    return {name: devices[i] for name, i in device_map.items()}


def shard(model: Transformer, device_map: dict[str, torch.device]) -> Transformer:
    """Move every module to its device in ``device_map`` and tell the model where its layers are."""
    tied = model.lm_head.weight is model.model.embed_tokens.weight
    for name, device in device_map.items():
        if name == "inv_freq" or (tied and name == "lm_head"):  # RoPE table, tied head: with the embedding
            continue
        model.get_submodule(name).to(device)
    model.inv_freq = model.inv_freq.to(device_of(device_map, "model.embed_tokens"))
    model.layer_devices = [device_of(device_map, f"model.layers.{i}") for i in range(model.num_layers)]
    return model


def device_of(device_map: dict[str, torch.device], name: str) -> torch.device:
    """The device ``device_map`` gives module ``name``: its own entry or its closest parent's."""
    while name not in device_map:
        if not name:
            raise MirrorSDError("the device map does not place every module of the model")
        name = name.rpartition(".")[0]
    return device_map[name]


def shard_over(model: Transformer, devices: list[torch.device]) -> Transformer:
    """Shard ``model`` over ``devices`` (CUDA GPUs) by their free memory."""
    return shard(model, plan(model, devices, [free_memory(d) for d in devices]))


def needs_sharding(model: Transformer, device: torch.device) -> bool:
    """Whether the model's weights are larger than what ``device`` (a CUDA GPU) can hold."""
    return device.type == "cuda" and weight_bytes(model) > free_memory(device)
