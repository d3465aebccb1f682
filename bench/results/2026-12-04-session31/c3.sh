# Session 31 call 3 (tree $1): the grouped GEMM's record (peers in the same run) and both sanitizers on the MoE
# case and on the attention / gated delta rule case (the gradients kernel's new stores).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c3/record
SECONDS=0
timeout 100 python3 -m kgen build --family grouped_gemm --family gated_delta_rule_chunk -j 16 -q > $OUT/c3/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c3/build.log
timeout 200 python3 bench/run_all.py --out $OUT/c3/record --benchmarks "grouped gemm" > $OUT/c3/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"
python3 bench/plots.py $OUT/c3/record > /dev/null 2>&1
grep "grouped gemm" $OUT/c3/record/SUMMARY.md | cut -d'|' -f3,4,7
for part in moe attention_and_gated_delta_rule; do for tool in memcheck racecheck; do
  [ $SECONDS -gt 500 ] && break
  timeout $((580 - SECONDS)) compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py $part > $OUT/c3/san_${part}_$tool.log 2>&1; echo "$part $tool rc=$? ${SECONDS}s"; tail -1 $OUT/c3/san_${part}_$tool.log
done; done
cd $OUT && tar czf c3.tgz c3 && rm -rf c3
