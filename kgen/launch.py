"""Launching a loaded kernel with cuda.core on PyTorch's current stream.

The hot path is a few dictionary look-ups and ``cuda.core.launch``: stream
wrappers and launch configurations are cached, so a repeated call allocates
nothing on the host and never synchronises with the device (and so can be
captured in a CUDA graph).
"""

from __future__ import annotations

import torch
from cuda.bindings import driver
from cuda.core import Kernel, LaunchConfig, Stream, launch

#: Above this, a kernel must opt in to dynamic shared memory (cuFuncSetAttribute).
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024
_MAX_CACHED_CONFIGS = 4096

_streams: dict[int, Stream] = {}
# torch.cuda.current_stream() builds a Python Stream object per call (about
# 1 us); the raw handle is what cuda.core needs, and it is what Triton reads too.
# (Absent from CPU-only torch builds, where no kernel is ever launched.)
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream(device_index: int) -> Stream:
    """The cuda.core view of torch's current stream on ``device_index``, cached per raw handle."""
    handle = _raw_current_stream(device_index)
    stream = _streams.get(handle)
    if stream is None:
        stream = _streams[handle] = Stream.from_handle(handle)
    return stream


def _check(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")


class KernelLauncher:
    """One kernel on one device, with a fixed block shape and dynamic shared memory size."""

    def __init__(self, kernel: Kernel, device_index: int, threads: int, dynamic_smem: int = 0):
        self.kernel = kernel
        self.device_index = device_index
        self.threads = threads
        self.dynamic_smem = dynamic_smem
        self._configs: dict[int | tuple, LaunchConfig] = {}
        if dynamic_smem > DEFAULT_DYNAMIC_SMEM_LIMIT:
            _check(driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem, kernel.handle, device_index))

    def _new_config(self, grid: int | tuple) -> LaunchConfig:
        if len(self._configs) >= _MAX_CACHED_CONFIGS:
            self._configs.clear()
        config = self._configs[grid] = LaunchConfig(grid=grid, block=self.threads, shmem_size=self.dynamic_smem)
        return config

    def __call__(self, grid: int | tuple, *args) -> None:
        """Launch on ``grid`` on torch's current stream; ``args`` are int pointers, Python ints (64-bit) or numpy scalars.

        The caller makes this launcher's device the current one.
        """
        config = self._configs.get(grid) or self._new_config(grid)
        launch(current_stream(self.device_index), config, self.kernel, *args)
