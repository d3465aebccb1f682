"""What the families' torch.library wrappers share: the glue between a public call and a registered op.

A registered op returns new tensors and takes a plan as its recipe (ints) and its device tables
(tensors); a plan must be made outside the compiled code, since planning reads lengths on the host.
"""

from __future__ import annotations

import torch

from kgen.runtime.tables import DeviceTables


def into(results: tuple, outs: tuple) -> tuple:
    """An op's fresh results, copied into the caller's preallocated tensors where given."""
    return tuple(r if o is None else o.copy_(r) for r, o in zip(results, outs))


def placed(tables: DeviceTables, device: torch.device, what: str) -> tuple[torch.Tensor, ...]:
    """A plan's tables, which must already be on the tensors' device (a compiled graph cannot copy them there)."""
    found = tables.placed(device)
    if found is None:
        raise ValueError(f"plan: its {what} is not on {device}, the tensors' device; under torch.compile "
                         f"plan with device={str(device)!r}")
    return found


def needs_plan(op: str, plan) -> None:
    if plan is None:
        raise ValueError(f"{op}: under torch.compile pass a plan (made outside the compiled code, with device=): "
                         f"planning reads the lengths on the host")
