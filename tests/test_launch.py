"""The launcher's argument checks, on the CPU: arguments go by name, in the contract's order, with the
declared kinds; the compiled entry's parameter sizes must be the contract's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from kgen.contract import parameters
from kgen.launch import KernelLauncher, LaunchArgumentError

PARAMETERS = parameters("const T* x, T* out, long long n, float scale")


def _launcher(sizes=(8, 8, 8, 4)) -> KernelLauncher:
    kernel = SimpleNamespace(arguments_info=[SimpleNamespace(size=s) for s in sizes], handle=None)
    return KernelLauncher(kernel, 0, 128, 0, PARAMETERS, "toy.entry")


def test_arguments_by_name_in_order_pass_the_checks():
    _launcher()._check_arguments(dict(x=1, out=2, n=3, scale=np.float32(0.5)))


@pytest.mark.parametrize("args, message", [
    (dict(x=1, out=2, n=3), r"missing \['scale'\]"),
    (dict(x=1, out=2, n=3, scale=np.float32(1), extra=0), r"unknown \['extra'\]"),
    (dict(out=2, x=1, n=3, scale=np.float32(1)), "in another order"),
    (dict(x=1, out=2, n=3.0, scale=np.float32(1)), r"parameter n \(long long\) takes int, got float"),
    (dict(x=1, out=2, n=True, scale=np.float32(1)), r"parameter n \(long long\) takes int, got bool"),
    (dict(x=1, out=2, n=3, scale=0.5), r"parameter scale \(float\) takes float32, got float"),
])
def test_wrong_arguments_are_refused_by_name(args, message):
    with pytest.raises(LaunchArgumentError, match=message):
        _launcher()._check_arguments(args)


def test_a_cubin_whose_parameters_differ_from_the_contract_is_refused():
    with pytest.raises(LaunchArgumentError, match=r"the cubin's parameters are 3 of sizes \[8, 8, 8\]"):
        _launcher(sizes=(8, 8, 8))


def test_the_signature_is_rendered_from_the_declaration():
    from kgen.contract import LaunchContract

    contract = LaunchContract(threads=128, dynamic_smem_bytes=0, sizes={}, parameters={
        "e": parameters("kgen::TmaDescriptor map_x, const T* x, long long n, float scale")})
    assert contract.signature("e") == ("const __grid_constant__ kgen::TmaDescriptor map_x, const T* __restrict__ x, "
                                       "long long n, float scale")
