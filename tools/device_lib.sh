# Sourced on the device, from the repository root with DIR set (a folder outside $OUT), by a call that compares kgen
# trees readied by tools/device_trees.sh. Each function takes tree names (folders of .ab3/trees) and writes its logs
# to DIR; bench/, tests/ and tools/ are the checkout's own, the kgen they import is the tree's. `pack` puts DIR into
# $OUT as one archive: call it after each step, so that a call cut off at its time limit still brings back what it
# did (the device returns at most 8 files from $OUT).
# `python3 -P` for -m runs: without it Python puts the working directory (the checkout) first on sys.path, and kgen
# build and pytest would import the checkout's kgen instead of the tree's.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p "$DIR"
tree() { echo "/tmp/site:$PWD/.ab3/trees/$1:$PWD/tests:$PWD/bench"; }
# The grouped GEMM and quantizer variants, compiled into each tree's own cache (its cache/ folder).
build() {
  for t in "$@"; do
    PYTHONPATH=$(tree "$t") timeout 100 python3 -P -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > "$DIR/build_$t.log" 2>&1
    echo "build $t rc=$? ${SECONDS}s"; tail -1 "$DIR/build_$t.log"
  done
}
# One process of tools/ab_grouped_gemm_forms.py (the op's own kernel choice) under tree $1, appended to
# DIR/ab_$1.jsonl; the rest of the arguments go to it. tools/ab_summary.py DIR BASE OTHER... summarises.
ab() {
  local t=$1; shift
  PYTHONPATH=$(tree "$t") timeout 120 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in "$@" >> "$DIR/ab_$t.jsonl" 2>> "$DIR/ab.err"
  echo "ab $t rc=$? ${SECONDS}s"
}
# The grouped GEMM GPU tests (plain, SwiGLU, FP8) of tree $1, into DIR/gpu_tests_$1.log.
gpu_tests() {
  local log=$DIR/gpu_tests_$1.log
  PYTHONPATH=$(tree "$1") python3 -P -c "import kgen; print('kgen', kgen.__file__)" > "$log" 2>&1
  PYTHONPATH=$(tree "$1") timeout 240 python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_grouped_gemm_fp8_gpu.py >> "$log" 2>&1
  local rc=$?
  echo "tests $1 rc=$rc ${SECONDS}s"; tail -1 "$log"; grep -E "^FAILED" "$log" | head
  return $rc
}
# compute-sanitizer tools ($2...) on tools/sanitizer_case.py's MoE case under tree $1, while the call has time left
# (SANITIZE_UNTIL seconds of it, 540 unless set).
sanitize() {
  local t=$1; shift
  for tool in "$@"; do
    [ "$SECONDS" -gt "${SANITIZE_UNTIL:-540}" ] && break
    PYTHONPATH=$(tree "$t") timeout $((590 - SECONDS)) compute-sanitizer --tool "$tool" --report-api-errors no python3 tools/sanitizer_case.py moe > "$DIR/san_moe_${tool}_$t.log" 2>&1
    echo "moe $tool $t rc=$? ${SECONDS}s"; tail -1 "$DIR/san_moe_${tool}_$t.log"
  done
}
# The grouped GEMM record (bench/run_all.py, peers in the same run) of tree $1, into DIR/record_$1, and its failing
# rows.
record() {
  mkdir -p "$DIR/record_$1"
  PYTHONPATH=$(tree "$1") KGEN_COMMIT=$(cat ".ab3/trees/$1/REVISION") timeout 150 python3 bench/run_all.py --out "$DIR/record_$1" --benchmarks "grouped gemm" > "$DIR/record_$1/run_all.log" 2>&1
  echo "record $1 rc=$? ${SECONDS}s"
  grep "grouped gemm" "$DIR/record_$1/SUMMARY.md" | grep FAIL | cut -d'|' -f3,4,7
}
pack() { tar czf "$OUT/$(basename "$DIR").tgz" -C "$(dirname "$DIR")" "$(basename "$DIR")"; }
