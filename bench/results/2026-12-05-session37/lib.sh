# Shared by session 36's calls (sourced from the repository root with DIR set): the jsonschema wheels, one
# PYTHONPATH per tree in .ab3/s36 (git archives of the branches), builds, one A/B process of a tree
# (tools/ab_grouped_gemm_forms.py; summarised by tools/ab_summary.py), the grouped GEMM GPU tests, the MoE sanitizers.
# `python3 -P` for -m runs: without it Python puts the working directory (main's checkout) first on sys.path, and
# kgen build and pytest would import main's kgen instead of the tree's (checked: a probe test printed main's).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONUNBUFFERED=1
mkdir -p $DIR
tree() { echo /tmp/site:$PWD/.ab3/s36/$1:$PWD/tests:$PWD/bench; }
build() {
  for t in "$@"; do
    PYTHONPATH=$(tree $t) timeout 100 python3 -P -m kgen build --family grouped_gemm --family quantize_fp8_blockwise -j 16 -q > $DIR/build_$t.log 2>&1
    echo "build $t rc=$? ${SECONDS}s"; tail -1 $DIR/build_$t.log
  done
}
ab() {
  local t=$1; shift
  PYTHONPATH=$(tree $t) timeout 120 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in "$@" >> $DIR/ab_$t.jsonl 2>> $DIR/ab.err
  echo "$t rc=$? ${SECONDS}s"
}
gpu_tests() {
  PYTHONPATH=$(tree $1) python3 -P -c "import kgen; print('kgen', kgen.__file__)" > $DIR/gpu_tests.log 2>&1
  PYTHONPATH=$(tree $1) timeout 240 python3 -P -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py tests/test_grouped_gemm_fp8_gpu.py >> $DIR/gpu_tests.log 2>&1
  echo "tests rc=$? ${SECONDS}s"; tail -1 $DIR/gpu_tests.log; grep -E "^FAILED" $DIR/gpu_tests.log | head
}
sanitize() {
  local t=$1; shift
  for tool in "$@"; do
    [ $SECONDS -gt 540 ] && break
    PYTHONPATH=$(tree $t) timeout $((590 - SECONDS)) compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $DIR/san_moe_$tool.log 2>&1
    echo "moe $tool rc=$? ${SECONDS}s"; tail -1 $DIR/san_moe_$tool.log
  done
}
# The grouped GEMM record (bench/run_all.py, peers in the same run) of tree $1 at commit $2, into $DIR/record_$1.
record() {
  mkdir -p $DIR/record_$1
  PYTHONPATH=$(tree $1) KGEN_COMMIT=$2 timeout 150 python3 bench/run_all.py --out $DIR/record_$1 --benchmarks "grouped gemm" > $DIR/record_$1/run_all.log 2>&1
  echo "record $1 rc=$? ${SECONDS}s"
  grep "grouped gemm" $DIR/record_$1/SUMMARY.md | grep FAIL | cut -d'|' -f3,4,7
}
