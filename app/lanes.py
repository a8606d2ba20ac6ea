"""The lanes as the page names them, read from their labels (``mirror_sd.devices.LaneLabel``), a live
pair's and a recording's alike: the timeline's row labels (``app.figures``), the device line above the
tabs (a live race's: ``handlers.hardware_notice``; a recording's: ``replay.recorded_devices``) and the
fastest method's reason (``app.predict``).
"""
from __future__ import annotations

from mirror_sd.devices import LaneLabel

PROCESSOR = {"cpu": "CPU", "cuda": "GPU", "mps": "GPU"}  # a device type, as the page names it


def one_processor(labels: list[str]) -> str | None:
    """What every lane shares where they all run on one processor: "cpu" (core groups of one CPU), or
    the GPU ("cuda:0": streams of one GPU); None where they do not, or a label is of another form."""
    lanes = [LaneLabel.read(label) for label in labels]
    if len(lanes) < 2 or None in lanes:
        return None
    if {lane.kind for lane in lanes} == {"cpu"}:
        return "cpu"
    devices = {lane.device for lane in lanes}
    return devices.pop() if len(devices) == 1 else None


def same_processor(labels: list[str]) -> bool:
    """Whether all lanes run on one processor: core groups of one CPU, or one GPU shared by both."""
    return one_processor(labels) is not None


def row_label(label: str, labels: list[str]) -> str:
    """A lane's row on a chart: its real device, the role it stands in for, and whether it shares one
    processor with the other lane; e.g. 'target on cpu:0<br>plays the GPU (same CPU as the other lane)', or
    'draft on cuda:0, 2nd stream<br>plays the NPU (same GPU as the other lane)'."""
    lane = LaneLabel.read(label)
    if lane is None:
        return label
    processor = PROCESSOR.get(lane.kind, lane.kind.upper())
    shared = f" (same {processor} as the other lane)" if same_processor(labels) else ""
    return f"{lane.name} on {lane.display}<br>plays the {lane.plays}{shared}"


def lanes_line(labels: list[str]) -> str:
    """The device line's lanes: 'Target lane: **cpu:0**, playing the GPU; draft lane: **cpu:1**, playing the
    NPU.' ('' with no label of the usual form)."""
    lanes = [lane for lane in map(LaneLabel.read, labels) if lane is not None]
    text = "; ".join(f"{lane.name} lane: **{lane.display}**, playing the {lane.plays}" for lane in lanes)
    return f"{text[0].upper()}{text[1:]}." if text else ""
