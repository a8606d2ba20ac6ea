"""NVML readings: sampled only for CUDA lanes, kept in the trace, exported and drawn.

No NVIDIA GPU here, so a stand-in ``pynvml`` module answers the calls the sampler makes; on a
machine without NVML the sampler must stay silent.
"""
import json
import sys
import time
import types

import torch

from app import figures
from mirror_sd.devices import Lane, shard_lane
from mirror_sd.nvml import GpuSampler
from mirror_sd.trace import Trace


def fake_pynvml(readings):
    """A pynvml stand-in whose GPU i reports readings[i] percent busy; it logs init/shutdown."""
    calls = []
    module = types.SimpleNamespace(
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetUtilizationRates=lambda handle: types.SimpleNamespace(gpu=readings[handle], memory=0))
    return module, calls


def test_cuda_lanes_are_sampled_into_the_trace_and_drawn(monkeypatch):
    module, calls = fake_pynvml({0: 80, 1: 35})
    monkeypatch.setitem(sys.modules, "pynvml", module)
    trace = Trace("mirror")
    lanes = [Lane("target", torch.device("cuda", 0)), Lane("draft", torch.device("cuda", 1))]
    with GpuSampler(trace, lanes, period_s=0.01):
        time.sleep(0.15)
    assert calls == ["init", "shutdown"]
    by_device = {d: [g.percent for g in trace.gpu_samples if g.device == d] for d in ("cuda:0", "cuda:1")}
    assert len(by_device["cuda:0"]) >= 3 and set(by_device["cuda:0"]) == {80}
    assert set(by_device["cuda:1"]) == {35}
    times = [g.t for g in trace.gpu_samples]
    assert times == sorted(times) and 0 <= times[0] < times[-1] < 1.0
    count = len(trace.gpu_samples)
    time.sleep(0.05)
    assert len(trace.gpu_samples) == count  # closed: no more readings

    again = Trace.from_json(trace.to_json())
    assert again.gpu_samples == trace.gpu_samples
    counters = [e for e in trace.to_chrome_trace()["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == count and counters[0]["args"]["percent"] in (80, 35)
    json.dumps(counters)

    fig = figures.utilisation({"mirror": trace})
    nvml_lines = {t.name: list(t.y) for t in fig.data if t.name and "NVML" in t.name}
    assert set(nvml_lines) == {"cuda:0 (NVML)", "cuda:1 (NVML)"}
    assert set(nvml_lines["cuda:0 (NVML)"]) == {80}


def test_cpu_lanes_or_no_driver_record_nothing(monkeypatch):
    module, calls = fake_pynvml({0: 50})
    monkeypatch.setitem(sys.modules, "pynvml", module)
    trace = Trace("sd")
    with GpuSampler(trace, [Lane("target", torch.device("cpu")), Lane("draft", torch.device("cpu"))], 0.01):
        time.sleep(0.03)
    assert calls == [] and trace.gpu_samples == []  # NVML is never touched for CPU lanes

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=no_driver))
    with GpuSampler(trace, [Lane("target", torch.device("cuda", 0))], 0.01):
        time.sleep(0.03)
    assert trace.gpu_samples == []
    fig = figures.utilisation({"sd": trace})
    assert not [t for t in fig.data if t.name and "NVML" in t.name]


def test_every_gpu_of_a_sharded_lane_is_sampled(monkeypatch):
    module, calls = fake_pynvml({0: 60, 1: 20, 2: 90})
    monkeypatch.setitem(sys.modules, "pynvml", module)
    trace = Trace("sd")
    target = Lane("target", torch.device("cuda", 0))
    shard_lane(target, [torch.device("cuda", 0), torch.device("cuda", 2)])
    with GpuSampler(trace, [target], period_s=0.01):
        time.sleep(0.05)
    assert {g.device for g in trace.gpu_samples} == {"cuda:0", "cuda:2"}


def test_the_stand_in_calls_exist_in_the_real_package():
    """The stand-in answers the calls the sampler makes; the real nvidia-ml-py must have each of them
    (a misnamed call once passed here and failed on the first real GPU)."""
    import importlib

    real = importlib.import_module("pynvml")
    module, _ = fake_pynvml({0: 1})
    assert all(callable(getattr(real, name, None)) for name in vars(module))


def test_an_nvml_error_mid_run_stops_the_readings_and_keeps_them(monkeypatch):
    readings = iter([70, 75])

    def utilisation(handle):
        return types.SimpleNamespace(gpu=next(readings), memory=0)  # StopIteration: the driver went away

    module, calls = fake_pynvml({0: 0})
    module.nvmlDeviceGetUtilizationRates = utilisation
    monkeypatch.setitem(sys.modules, "pynvml", module)
    trace = Trace("sd")
    with GpuSampler(trace, [Lane("target", torch.device("cuda", 0))], period_s=0.01):
        time.sleep(0.08)
    assert [g.percent for g in trace.gpu_samples] == [70, 75] and calls == ["init", "shutdown"]
