"""The GPU's own busy readings, from NVIDIA's management library (NVML), beside the spans.

Spans say when a lane was working; NVML says how busy the GPU itself was: the share of each sample
period (1/6 s to 1 s, the driver's choice) during which a kernel was running. While a generation
runs with a CUDA lane, :class:`GpuSampler` reads ``nvmlDeviceGetUtilizationRates`` every
``period_s`` on a background thread and adds each reading to the trace as ``(device, t, percent)``.
Elsewhere (no CUDA lane, no NVIDIA driver, or ``nvidia-ml-py`` not installed) it does nothing.
"""
from __future__ import annotations

import threading
import time

PERIOD_S = 0.05


def _nvml():
    """The pynvml module (package nvidia-ml-py), initialised, or None where NVML cannot be had."""
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml
    except Exception:  # no package, no driver, no NVIDIA GPU: utilisation comes from spans only
        return None


class GpuSampler:
    """Samples NVML utilisation of the CUDA devices of ``lanes`` into ``trace`` until closed."""

    def __init__(self, trace, lanes, period_s: float = PERIOD_S):
        self.trace, self.period_s = trace, period_s
        indices = sorted({d.index or 0 for lane in lanes for d in lane.devices if d.type == "cuda"})  # shards too
        self.nvml = _nvml() if indices else None
        self.handles = {f"cuda:{i}": self.nvml.nvmlDeviceGetHandleByIndex(i) for i in indices} if self.nvml else {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        if self.handles:
            self._thread.start()

    def _loop(self):
        while not self._stop.is_set():
            try:
                readings = {device: self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu
                            for device, handle in self.handles.items()}
            except Exception:  # NVML failed mid-run (a driver reset, say): keep what was read, stop reading
                return
            now = time.perf_counter()
            for device, percent in readings.items():
                self.trace.add_gpu_sample(device, now, percent)
            self._stop.wait(self.period_s)

    def close(self):
        if self.handles:
            self._stop.set()
            self._thread.join()
            self.nvml.nvmlShutdown()
            self.handles = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
