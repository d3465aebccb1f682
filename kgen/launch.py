"""Launching a loaded kernel with cuda.core on PyTorch's current stream.

The hot path is a few dictionary look-ups and ``cuda.core.launch``: stream
wrappers and launch configurations are cached, so a repeated call allocates
nothing on the host and never synchronises with the device (and so can be
captured in a CUDA graph). This module is the one place that touches private
torch and cuda.core names; each is named once below, with why.
"""

from __future__ import annotations

import keyword
import types
from collections import OrderedDict
from typing import Sequence

import numpy as np
import torch
from cuda.bindings import driver
from cuda.core import Kernel, LaunchConfig, Stream, launch

# The swizzle enum is documented with TensorMapDescriptor, but cuda.core 1.2.0 exports both only from here.
from cuda.core._tensor_map import TensorMapDescriptor, TensorMapSwizzle  # noqa: F401  (TensorMapSwizzle: for kgen.runtime.tma)

from kgen.contract import Parameter

#: Above this, a kernel must opt in to dynamic shared memory (cuFuncSetAttribute).
DEFAULT_DYNAMIC_SMEM_LIMIT = 48 * 1024
_MAX_CACHED_CONFIGS = 4096
_MAX_CACHED_STREAMS = 64

# torch.cuda.current_stream() builds a Python Stream object per call (about
# 1 us); the raw handle is what cuda.core needs, and it is what Triton reads too.
# torch.cuda.current_device() runs a lazy-init check per call; this reads the index alone.
# (Both are absent from CPU-only torch builds, where no kernel is ever launched.)
_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current_device = getattr(torch._C, "_cuda_getDevice", None)

_streams: OrderedDict[int, Stream] = OrderedDict()

#: Bytes each kind of parameter occupies in the kernel's parameter buffer.
_PARAMETER_BYTES = {"pointer": 8, "int64": 8, "float32": 4, "tensor_map": 128}
#: What a Python caller passes for each kind.
_PARAMETER_TYPES = {"pointer": (int,), "int64": (int,), "float32": (np.float32,), "tensor_map": (TensorMapDescriptor,)}


def current_device() -> int:
    return _current_device()


def current_stream(device_index: int) -> Stream:
    """The cuda.core view of torch's current stream on ``device_index``, cached per raw handle (the oldest of
    more than 64 handles is dropped, and rebuilt if it comes back)."""
    handle = _raw_current_stream(device_index)
    stream = _streams.get(handle)
    if stream is None:
        stream = _streams[handle] = Stream.from_handle(handle)
        if len(_streams) > _MAX_CACHED_STREAMS:
            _streams.popitem(last=False)
    return stream


def _check(result) -> None:
    err = result[0] if isinstance(result, tuple) else result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA driver call failed: {err}")


class LaunchArgumentError(TypeError):
    """A launch's arguments do not match the kernel entry's declared parameters."""


def _by_name(entry: str, names: tuple[str, ...], launcher: KernelLauncher):
    """A function ``entry(grid, /, *, <each parameter by name>)`` that launches with the values in the
    contract's order.

    Generated from the contract (as dataclasses and namedtuple make their methods), so that Python binds
    the arguments: a missing or unknown name is a TypeError naming the entry and the argument, the order of
    the caller's keywords does not matter, and no dict is built per call. A repeated launch (its types
    checked, its grid's config and the stream's wrapper cached, its device current) calls cuda.core from
    this function's own frame; anything else goes through ``launcher._launch_values``, which checks and
    fills the caches. That keeps a launch by name to one Python frame, as a positional one was.
    """
    for name in names:
        if not name.isidentifier() or keyword.iskeyword(name):
            raise LaunchArgumentError(f"{entry}: parameter {name!r} cannot be passed by name from Python")
    listed = ", ".join(names)
    source = (f"def {entry}(grid, /, *, {listed}):\n"
              f"    config = configs.get(grid)\n"
              f"    if config is not None and launcher._checked_call and current_device() == device_index:\n"
              f"        stream = streams.get(raw_current_stream(device_index))\n"
              f"        if stream is not None:\n"
              f"            return launch(stream, config, kernel, {listed})\n"
              f"    return launcher._launch_values(grid, ({listed},))\n")
    namespace = {"launcher": launcher, "configs": launcher._configs, "kernel": launcher.kernel,
                 "device_index": launcher.device_index, "current_device": _current_device, "streams": _streams,
                 "raw_current_stream": _raw_current_stream, "launch": launch}
    exec(source, namespace)  # noqa: S102 - the names are checked identifiers from the contract
    return namespace[entry]


class KernelLauncher:
    """One kernel entry on one device, with the block size, dynamic shared memory and parameters its contract gives."""

    def __init__(self, kernel: Kernel, device_index: int, threads: int, dynamic_smem: int,
                 parameters: Sequence[Parameter], name: str, cluster: int = 1):
        self.kernel = kernel
        self.device_index = device_index
        self.threads = threads
        self.dynamic_smem = dynamic_smem
        self.cluster = cluster
        self.parameters = tuple(parameters)
        self.name = name
        self._configs: dict[int | tuple, LaunchConfig] = {}
        self._resident_clusters: int | None = None
        self._checked_call = False
        #: ``launch(grid, *, <each parameter by name>)``: the launch (see :func:`_by_name`).
        self.launch = _by_name(name.rpartition(".")[2], tuple(p.name for p in self.parameters), self)
        self._check_signature()
        if dynamic_smem > DEFAULT_DYNAMIC_SMEM_LIMIT:
            _check(driver.cuKernelSetAttribute(
                driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                dynamic_smem, kernel.handle, device_index))

    def _check_signature(self) -> None:
        """The compiled entry's parameter sizes, as the driver reads them from the cubin, must be the declared ones."""
        actual = [info.size for info in self.kernel.arguments_info]
        declared = [_PARAMETER_BYTES[p.kind] for p in self.parameters]
        if actual != declared:
            raise LaunchArgumentError(f"{self.name}: the cubin's parameters are {len(actual)} of sizes {actual}; "
                                      f"its contract declares {len(declared)} of sizes {declared}")

    def _check_types(self, values: tuple) -> None:
        for parameter, value in zip(self.parameters, values):
            allowed = _PARAMETER_TYPES[parameter.kind]
            if isinstance(value, bool) or not isinstance(value, allowed):
                raise LaunchArgumentError(f"{self.name}: parameter {parameter.name} ({parameter.ctype}) takes "
                                          f"{' or '.join(t.__name__ for t in allowed)}, got {type(value).__name__}")

    def _new_config(self, grid: int | tuple) -> LaunchConfig:
        if len(self._configs) >= _MAX_CACHED_CONFIGS:
            self._configs.clear()
        if self.cluster == 1:
            config = LaunchConfig(grid=grid, block=self.threads, shmem_size=self.dynamic_smem)
        else:  # cuda.core counts a clustered launch's grid in clusters
            if not isinstance(grid, int) or grid % self.cluster:
                raise LaunchArgumentError(f"{self.name}: a grid of {grid} blocks is not whole clusters of {self.cluster}")
            config = LaunchConfig(grid=grid // self.cluster, cluster=self.cluster, block=self.threads,
                                  shmem_size=self.dynamic_smem)
        self._configs[grid] = config
        return config

    def resident_clusters(self) -> int:
        """How many of this kernel's clusters the device runs at once (a persistent grid's size), asked of the driver
        once per launcher (dispatch asks when it makes the launcher, before any call can be inside a capture)."""
        if self._resident_clusters is None:
            config = LaunchConfig(grid=1, cluster=self.cluster, block=self.threads, shmem_size=self.dynamic_smem)
            found = self.kernel.occupancy.max_active_clusters(config, stream=current_stream(self.device_index))
            if found < 1:
                raise RuntimeError(f"{self.name}: device {self.device_index} cannot hold one cluster of {self.cluster} "
                                   f"blocks of {self.threads} threads and {self.dynamic_smem} bytes of shared memory")
            self._resident_clusters = found
        return self._resident_clusters

    def bound(self, **fixed):
        """The launch function with ``fixed`` parameters set: a call passes only the others by name.

        For a call repeated with new addresses and the rest unchanged: Python fills the fixed values in from
        the function's keyword defaults, where a dict of every argument would be copied and unpacked per call.
        """
        unknown = sorted(set(fixed) - {p.name for p in self.parameters})
        if unknown:
            raise LaunchArgumentError(f"{self.name}: no parameter named {', '.join(unknown)}")
        function = types.FunctionType(self.launch.__code__, self.launch.__globals__, self.launch.__name__)
        function.__kwdefaults__ = fixed
        return function

    def __call__(self, grid: int | tuple, /, **args) -> None:
        """``launch(grid, **args)``, for callers that hold no reference to the launch function."""
        self.launch(grid, **args)

    def _launch_values(self, grid: int | tuple, values: tuple) -> None:
        """Launch on ``grid`` on torch's current stream of this launcher's device, with ``values`` in the
        contract's order: Python ints for pointers and 64-bit integers, ``np.float32`` for floats, tensor-map
        descriptors. The launches :func:`_by_name`'s function does not make itself come here: the first (whose
        types are checked), a new grid, a new stream, another current device."""
        if not self._checked_call:
            self._check_types(values)
            self._checked_call = True
        config = self._configs.get(grid) or self._new_config(grid)
        device_index = self.device_index
        if _current_device() == device_index:
            launch(current_stream(device_index), config, self.kernel, *values)
        else:
            with torch.cuda.device(device_index):
                launch(current_stream(device_index), config, self.kernel, *values)
