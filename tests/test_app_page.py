"""The page's outputs by name (app/page.py): a handler's Page becomes the positional values of the
outputs an event lists by the same names, cards one per method in the page's order; and the lanes
as the page names them (app/lanes.py), read from their labels in one place."""
import inspect

from app.lanes import lanes_line, one_processor, same_processor
from app.page import Outputs, Page, keep
from mirror_sd.devices import LaneLabel

NAMES = ["vanilla", "sd", "mirror"]


def outputs() -> Outputs:
    """Stand-in components: strings named after the field (cards: one per method)."""
    return Outputs(NAMES, status="status", replay="replay", results="results", clock="clock",
                   cards=[f"card-{n}" for n in NAMES])


def test_an_events_outputs_and_a_pages_values_follow_the_same_names():
    page = outputs()
    assert page.of("status", "cards", "results") == ["status", "card-vanilla", "card-sd", "card-mirror", "results"]
    values = page.values(Page(status="Done.", cards={"mirror": "<m>", "vanilla": "<v>"}, results={}),
                          ("status", "cards", "results"))
    assert values[0] == "Done." and values[1] == "<v>" and values[3] == "<m>" and values[4] == {}
    assert values[2] == keep()  # a card the page does not name stays as it is
    assert Page().status == keep() and Page().cards == {}


def test_a_wrapped_handler_keeps_its_signature_and_stays_a_generator():
    page = outputs()

    def handler(current, rejected=False):
        yield Page(cards={"sd": "<sd>"}, clock=1.5)
        yield Page(clock=None)

    wrapped = page.wrap(handler, "cards", "clock")
    assert inspect.isgeneratorfunction(wrapped) and inspect.signature(wrapped) == inspect.signature(handler)
    first, last = list(wrapped({}))
    assert first[1] == "<sd>" and first[3] == 1.5 and last[3] is None and last[0] == keep()
    one = page.wrap(lambda: Page(status="hi"), "status")
    assert one() == "hi"  # one output: its value alone, as Gradio takes it


def test_a_lane_label_is_read_back_in_one_place():
    label = LaneLabel.read("draft, NPU role, cuda:0, 2nd stream")
    assert (label.name, label.plays, label.device, label.kind, label.display) == (
        "draft", "NPU", "cuda:0", "cuda", "cuda:0, 2nd stream")
    assert str(label) == "draft, NPU role, cuda:0, 2nd stream" and LaneLabel.read("by hand") is None
    cpu = ["target, GPU role, cpu:0", "draft, NPU role, cpu:1"]
    gpu = ["target, GPU role, cuda:0", "draft, NPU role, cuda:0, 2nd stream"]
    assert one_processor(cpu) == "cpu" and one_processor(gpu) == "cuda:0"
    assert not same_processor(["target, GPU role, cuda:0", "draft, NPU role, cuda:1"]) and not same_processor(cpu[:1])
    assert lanes_line(gpu) == ("Target lane: **cuda:0**, playing the GPU; draft lane: **cuda:0, 2nd stream**, "
                               "playing the NPU.")
