"""What the families' torch.library wrappers share: the glue between a public call and a registered op.

A registered op returns new tensors and takes a plan as its recipe (ints) and its device tables
(tensors); a plan must be made outside the compiled code, since planning reads lengths on the host.
"""

from __future__ import annotations

import torch


def into(results: tuple, outs: tuple) -> tuple:
    """An op's fresh results, copied into the caller's preallocated tensors where given."""
    return tuple(r if o is None else o.copy_(r) for r, o in zip(results, outs))


def placed(tensor: torch.Tensor, device: torch.device, what: str) -> torch.Tensor:
    """A plan's table, which must already be on the tensors' device (a compiled graph cannot copy it there)."""
    if tensor.device != device:
        raise ValueError(f"plan: its {what} is on {tensor.device}, the tensors on {device}; under torch.compile "
                         f"plan with device={str(device)!r}")
    return tensor


def needs_plan(op: str, plan) -> None:
    if plan is None:
        raise ValueError(f"{op}: under torch.compile pass a plan (made outside the compiled code, with device=): "
                         f"planning reads the lengths on the host")
