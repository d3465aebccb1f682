"""What every family's host package shares at run time, once each.

``dispatch`` (variants to launchers, per device), ``checks`` (argument checks
that name the argument), ``device`` (SM count and grid limits), ``tables``
(a plan's tables on a device), ``tma`` (TMA descriptors and their one cache)
and ``recipes`` (plans as named records of ints, for torch.library).
"""
