"""Facts of the GPU a plan is made for: its SM count and the grid's limits."""

from __future__ import annotations

import functools

import torch

#: The largest grid y or z dimension CUDA launches.
GRID_YZ_LIMIT = 65535
#: The largest grid x dimension.
GRID_X_LIMIT = 2**31 - 1
#: SMs planned for when no GPU is visible (an H100/H200 SXM): plans made on a CPU-only machine.
DEFAULT_NUM_SMS = 132


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device | None = None) -> int:
    """The SMs of ``device`` (the current CUDA device by default), or :data:`DEFAULT_NUM_SMS` without a GPU."""
    if not torch.cuda.is_available():
        return DEFAULT_NUM_SMS
    index = torch.cuda.current_device() if device is None or device.index is None else device.index
    return _sm_count(index)
