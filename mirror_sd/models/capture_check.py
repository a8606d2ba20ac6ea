"""A check that a stage body can be captured as a CUDA graph, run on its eager warm-up.

A CUDA graph records kernels. Two kinds of operation break a capture, and a failed capture can
leave PyTorch's allocator and random-number state unusable for the rest of the process, so they
are looked for before it, on the warm-up run (models/stages.py: ``Stage.capture``), and in the CPU
tests (tests/test_capture_safe.py):

* an operation whose result the host must read: ``.item()`` (also indexing by a 0-d tensor),
  ``.tolist()``, a tensor's truth value, a boolean mask's indexing (``nonzero``), a repeat by a
  tensor. It synchronises, and the recorded shapes would depend on the data;
* a copy between the host and the device: ``torch.tensor(..., device=gpu)`` or a host tensor
  used as an index in the body, a Python number assigned through a tensor index
  (``x[rows, cols] = True`` copies a CPU scalar tensor; ``x[:, 0] = True`` fills, which is fine),
  ``.cpu()``. A capture refuses a copy from pageable host memory, and a copy back waits for the GPU.

On the CPU everything is on the host, so most such copies do not happen: the CPU tests also run
each body with its model and buffers on PyTorch's ``meta`` device, which stands for the GPU there
(shapes and devices, no data), so that every copy between it and the host shows.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import MirrorSDError

READS_BACK = {"_local_scalar_dense", "nonzero", "masked_select", "is_nonzero", "unique", "equal", "_unique2",
              "nonzero_static", "masked_scatter", "repeat_interleave"}
INDEXING = {"index", "index_put", "index_put_", "_index_put_impl_"}


class CaptureUnsafe(MirrorSDError):
    """A stage body runs an operation a CUDA graph cannot capture."""


def _tensors(values):
    for v in values:
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, (list, tuple)):
            yield from _tensors(v)


class CaptureCheck(TorchDispatchMode):
    """Raises :class:`CaptureUnsafe` on any operation that would break a CUDA graph's capture."""

    def __init__(self):
        super().__init__()
        self.host_values = []  # tensors made from host values in this run (torch.tensor, x[i] = a number)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in INDEXING and any(i.dtype == torch.bool for i in _tensors(args[1:2])):
            raise CaptureUnsafe(f"{name} by a boolean mask reads a number back to the host")
        if name in READS_BACK and not (name == "repeat_interleave" and isinstance(args[1], int)):
            raise CaptureUnsafe(f"{name} reads a number back to the host")
        if name in INDEXING and len({t.device for t in _tensors(args)}) > 1:
            raise CaptureUnsafe(f"{name} copies between {' and '.join(sorted({str(t.device) for t in _tensors(args)}))}")
        if name.startswith("index_put") and any(args[2] is v for v in self.host_values):
            raise CaptureUnsafe(f"{name} of a host value (x[i] = a number) copies it onto the device")
        if name == "copy_" and _from_pageable_host(args[1], args[0].device) or \
                name == "_to_copy" and _from_pageable_host(args[0], kwargs.get("device")):
            raise CaptureUnsafe(f"{name} from pageable host memory onto the device")
        if name == "copy_" and _back_to_host(args[1], args[0].device) or \
                name == "_to_copy" and _back_to_host(args[0], kwargs.get("device")):
            raise CaptureUnsafe(f"{name} from the device back to the host")
        out = func(*args, **kwargs)
        if name == "lift_fresh":
            self.host_values.append(out)
        return out


def _from_pageable_host(source, onto) -> bool:
    """Whether copying ``source`` onto the device ``onto`` (None: where it is) goes from pageable
    host memory onto another device (a GPU, or ``meta`` standing for one)."""
    on_the_host = isinstance(source, torch.Tensor) and source.device.type == "cpu"
    onto_a_device = onto is not None and torch.device(onto).type != "cpu"
    return on_the_host and onto_a_device and not source.is_pinned()


def _back_to_host(source, onto) -> bool:
    """Whether copying ``source`` onto ``onto`` (None: where it is) brings it from a device to the host."""
    on_a_device = isinstance(source, torch.Tensor) and source.device.type != "cpu"
    return on_a_device and onto is not None and torch.device(onto).type == "cpu"
