#!/usr/bin/env bash
# Everything the GPU machine is for, in one call: the kernel build table, the GPU
# tests, and the benchmarks with their peers in the same run.
#
#   KGEN_COMMIT=$(git rev-parse HEAD) bash tools/gpu_check.sh
#
# KGEN_BENCHMARKS="gdn chunk,gdn step" runs only those benchmarks (run_all's names), for a
# session whose device time cannot hold them all (KGEN_BENCHMARKS=none: no benchmark); results for the
# record come from a run of all. KGEN_GPU_TESTS="tests/a.py tests/b.py" runs only those GPU test files, and
# KGEN_BUILD=0 skips the build table: a call for new kernels alone, e.g.
#   KGEN_BUILD=0 KGEN_GPU_TESTS="tests/test_grouped_gemm_gpu.py" KGEN_BENCHMARKS=none bash tools/gpu_check.sh
#
# Results go to $OUT (the device tool brings that folder back; it takes at most
# 8 files, so the per-benchmark files travel in one archive), else bench/results/latest.
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${OUT:-bench/results/latest}
work=$(mktemp -d)
mkdir -p "$dest"
export PYTHONUNBUFFERED=1

# Python packages the device image lacks travel as wheels in .whl/ (see README).
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export KGEN_COMMIT="${KGEN_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"

status=0
{ echo "commit $KGEN_COMMIT"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv
  if [ "${KGEN_BUILD:-1}" != 0 ]; then
    python3 -m kgen build
    # The variants one axis from the built-in ones, which tests/test_neighbour_variants_gpu.py runs.
    KGEN_SPEC_PATH=tests/specs/neighbours python3 -m kgen build
  fi; } > "$work/build.log" 2>&1 || status=1
tail -n 3 "$work/build.log"
cp "$work/build.log" "$dest/"  # each log as soon as it is complete, so a run cut short still reports
# shellcheck disable=SC2086  # the list of test files splits on spaces
python3 -m pytest -m gpu -q -p no:cacheprovider ${KGEN_GPU_TESTS:-} > "$work/gpu_tests.log" 2>&1 || status=1
tail -n 12 "$work/gpu_tests.log"
cp "$work/gpu_tests.log" "$dest/"
# One small case per kernel class under compute-sanitizer (its driver-API probes are noise).
for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --report-api-errors no python3 tools/sanitizer_case.py \
        > "$work/sanitizer_$tool.log" 2>&1 || status=1
    tail -n 2 "$work/sanitizer_$tool.log"
    cp "$work/sanitizer_$tool.log" "$dest/"
done
if [ "${KGEN_BENCHMARKS:-}" != none ]; then
    python3 bench/run_all.py --out "$work/bench" --benchmarks "${KGEN_BENCHMARKS:-}" || status=1
    python3 bench/plots.py "$work/bench" || true  # the figures of whichever results this run has
    cp "$work/bench/SUMMARY.md" "$work/bench/summary.json" "$dest/" 2>/dev/null
    tar czf "$dest/bench_details.tgz" -C "$work" bench
fi
exit $status
