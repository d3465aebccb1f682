"""How long the largest spec kgen accepts takes to expand: 4,096 variants against 4,096 exclusions.

    python3 bench/bench_spec.py

Expansion is one set lookup per variant and distinct exclusion axis set; comparing each variant with
each exclusion instead took about 14x longer on a 2-core machine (0.35 s against 4.8 s).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from kgen.spec import load_spec_file  # noqa: E402
from test_spec import largest_exclusion_spec  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "largest.yaml"
        path.write_text(yaml.safe_dump(largest_exclusion_spec()))
        times = []
        for _ in range(5):
            start = time.perf_counter()
            load_spec_file(path)
            times.append(time.perf_counter() - start)
    print(f"largest spec: load and expand {statistics.median(times) * 1e3:.0f} ms (median of 5)")


if __name__ == "__main__":
    main()
