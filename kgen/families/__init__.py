"""kgen's built-in kernel families, one host package each.

A family's package holds its launch contract (``contract.py``: what the host must know of each
kernel, see :mod:`kgen.contract`), its planner, its eager op, its torch.library registration with
its fake, and its public functions in ``__init__``. The family's spec names the package
(``host:``); nothing here lists the families, so a new one (docs/architecture.md) edits no
shared module.
"""
