"""A plan's tables on the devices it runs on: host arrays copied to each device once, on first use.

A plan is made on the host (it reads lengths there); its kernels read its tables
(work lists, segments, a split workspace) from the device. Copying on first use
would allocate inside a CUDA-graph capture, which cannot be replayed, so a plan
meant for capture is placed beforehand (``plan_...(device=...)``) and a copy
attempted during capture is refused with a message saying so. Tables made
inside an op come from kgen's own pool (:func:`kgen.runtime.dispatch.kept_allocations`).
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

from kgen.runtime.checks import cuda_device


class DeviceTables:
    """The tensors ``make(device)`` gives, made once per device.

    ``one_device``: the tables live on the first device they are made on (or adopted for), and any other is
    refused: for a plan whose choices were made for one GPU (its arch).
    """

    def __init__(self, make: Callable[[torch.device], Sequence[torch.Tensor]], what: str, *, one_device: bool = False):
        self._make, self._what, self._one_device = make, what, one_device
        self._by_device: dict[torch.device, tuple[torch.Tensor, ...]] = {}

    def on(self, device) -> tuple[torch.Tensor, ...]:
        found = self._by_device.get(device)  # the common call: a device with its index, seen before
        if found is not None:
            return found
        device = cuda_device(device)
        found = self._by_device.get(device)
        if found is None:
            if self._one_device and self._by_device:
                raise ValueError(f"plan: its {self._what} is on {next(iter(self._by_device))}, the tensors on {device}; "
                                 f"plan with device={str(device)!r}")
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise RuntimeError(f"plan: its {self._what} are placed on first use, which a CUDA-graph capture "
                                   f"cannot do; plan with device={str(device)!r} (or run once) before capturing")
            found = self._by_device[device] = tuple(self._make(device))
        return found

    def adopt(self, device, tensors: Sequence[torch.Tensor]) -> None:
        """Use ``tensors`` (a compiled graph's copies of the tables) as those on ``device``."""
        self._by_device[cuda_device(device)] = tuple(tensors)

    def placed(self, device) -> tuple[torch.Tensor, ...] | None:
        """The tables on ``device`` if they are there already (a compiled graph cannot copy them)."""
        return self._by_device.get(cuda_device(device))

    def devices(self) -> list[torch.device]:
        return list(self._by_device)
