"""The launcher's argument checks, on the CPU: arguments go by name (Python binds them to a function generated
from the contract), with the declared kinds; the compiled entry's parameter sizes must be the contract's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kgen.contract import LaunchContract, parameters
from kgen.launch import KernelLauncher, LaunchArgumentError

PARAMETERS = parameters("const T* x, T* out, long long n, float scale")


def _launcher(sizes=(8, 8, 8, 4), declared=PARAMETERS) -> KernelLauncher:
    kernel = SimpleNamespace(arguments_info=[SimpleNamespace(size=s) for s in sizes], handle=None)
    return KernelLauncher(kernel, 0, 128, 0, declared, "toy[dtype=fp32].toy_scale")


def test_arguments_are_bound_by_name_in_any_order_and_reach_the_kernel_in_the_contract_s():
    launcher, seen = _launcher(), []
    launcher._launch_values = lambda grid, values: seen.append((grid, values))  # no GPU: record instead
    launcher.launch(3, scale=np.float32(0.5), n=7, out=2, x=1)
    launcher(4, x=1, out=2, n=7, scale=np.float32(0.5))
    assert seen == [(3, (1, 2, 7, np.float32(0.5))), (4, (1, 2, 7, np.float32(0.5)))]


def test_a_bound_launch_takes_the_fixed_arguments_from_its_defaults_and_the_others_by_name():
    launcher, seen = _launcher(), []
    launcher._launch_values = lambda grid, values: seen.append((grid, values))
    scale_by_half = launcher.bound(n=7, scale=np.float32(0.5))
    scale_by_half(3, out=2, x=1)
    scale_by_half(3, out=4, x=3, n=8)  # a fixed argument can still be passed
    assert seen == [(3, (1, 2, 7, np.float32(0.5))), (3, (3, 4, 8, np.float32(0.5)))]
    with pytest.raises(TypeError, match=r"toy_scale\(\) missing 1 required keyword-only argument: 'x'"):
        scale_by_half(3, out=2)
    with pytest.raises(LaunchArgumentError, match="toy_scale: no parameter named extra"):
        launcher.bound(extra=1)


@pytest.mark.parametrize("args, message", [
    (dict(x=1, out=2, n=3), r"toy_scale\(\) missing 1 required keyword-only argument: 'scale'"),
    (dict(x=1, out=2, n=3, scale=np.float32(1), extra=0), r"toy_scale\(\) got an unexpected keyword argument 'extra'"),
])
def test_a_missing_or_unknown_name_is_refused_naming_the_entry_and_the_argument(args, message):
    with pytest.raises(TypeError, match=message):
        _launcher().launch(1, **args)


@pytest.mark.parametrize("args, message", [
    (dict(x=1, out=2, n=3.0, scale=np.float32(1)), r"parameter n \(long long\) takes int, got float"),
    (dict(x=1, out=2, n=True, scale=np.float32(1)), r"parameter n \(long long\) takes int, got bool"),
    (dict(x=1, out=2, n=3, scale=0.5), r"parameter scale \(float\) takes float32, got float"),
])
def test_a_wrong_kind_is_refused_on_the_first_launch_before_anything_runs(args, message):
    with pytest.raises(LaunchArgumentError, match=message):
        _launcher().launch(1, **args)


def test_a_cubin_whose_parameters_differ_from_the_contract_is_refused():
    with pytest.raises(LaunchArgumentError, match=r"the cubin's parameters are 3 of sizes \[8, 8, 8\]"):
        _launcher(sizes=(8, 8, 8))


def test_a_parameter_python_cannot_name_is_refused():
    with pytest.raises(LaunchArgumentError, match="parameter 'lambda' cannot be passed by name"):
        _launcher(sizes=(8,), declared=parameters("const T* lambda"))


def test_the_signature_is_rendered_from_the_declaration():
    contract = LaunchContract(threads=128, dynamic_smem_bytes=0, sizes={}, parameters={
        "e": parameters("kgen::TmaDescriptor map_x, const T* x, long long n, float scale")})
    assert contract.signature("e") == ("const __grid_constant__ kgen::TmaDescriptor map_x, const T* __restrict__ x, "
                                       "long long n, float scale")


def test_a_repeated_launch_calls_cuda_core_from_the_generated_function_with_the_same_arguments(monkeypatch):
    import kgen.launch as launch_module

    launched = []
    monkeypatch.setattr(launch_module, "launch", lambda stream, config, kernel, *values: launched.append(
        (stream, config["grid"], kernel, values)))
    monkeypatch.setattr(launch_module, "_current_device", lambda: 0)
    monkeypatch.setattr(launch_module, "_raw_current_stream", lambda device_index: 1000 + device_index)
    monkeypatch.setattr(launch_module, "Stream", SimpleNamespace(from_handle=lambda handle: f"stream {handle}"))
    monkeypatch.setattr(launch_module, "LaunchConfig", lambda **fields: fields)
    monkeypatch.setattr(launch_module, "_streams", launch_module.OrderedDict())
    launcher = _launcher()
    arguments = dict(x=1, out=2, n=7, scale=np.float32(0.5))
    with pytest.raises(LaunchArgumentError, match="takes int, got float"):  # the first launch is checked
        launcher.launch(3, **dict(arguments, n=7.0))
    launcher.launch(3, **arguments)  # checked; fills the config and stream caches
    slow_path = launcher._launch_values
    launcher._launch_values = lambda grid, values: pytest.fail("a repeated launch took the slow path")
    launcher.launch(3, **arguments)
    launcher.bound(n=7, scale=np.float32(0.5))(3, x=1, out=2)
    launcher._launch_values = slow_path
    launcher.launch(5, **arguments)  # a new grid: its config is made on the slow path
    expected = ("stream 1000", 3, launcher.kernel, (1, 2, 7, np.float32(0.5)))
    assert launched == [expected] * 3 + [(*expected[:1], 5, *expected[2:])]
