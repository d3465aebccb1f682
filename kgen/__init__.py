"""kgen: CUDA kernels declared in YAML, rendered with Jinja, compiled with NVRTC, launched from PyTorch.

The pipeline, one module per stage: ``spec`` (read and validate a file) →
``registry`` (the search path, families, variants) → ``contract`` (what the host
knows of a kernel) → ``render`` (Jinja) → ``compiler`` (NVRTC, ptxas report) →
``cache`` (disk) → ``jit`` (one variant, end to end) → ``launch`` (cuda.core on
torch's stream); then ``runtime`` (what the families share at run time) and
``families`` (one host package per kernel family), re-exported by ``ops``.
docs/architecture.md draws it.
"""

__version__ = "0.1.0"

from kgen.registry import UnsupportedVariantError, add_spec_path  # noqa: E402
from kgen.spec import SpecError  # noqa: E402

__all__ = ["SpecError", "UnsupportedVariantError", "add_spec_path", "__version__"]
