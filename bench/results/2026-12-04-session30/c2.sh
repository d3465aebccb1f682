# Session 30 call 2 (tree $1): the grouped GEMM with four stages and FP8 scales a K block ahead: GPU tests, both
# sanitizers, the record; then issue 24's bars (every bar shape, both gate regimes) with FlashQLA in the same run,
# the kernel path as autograd's (KGEN_GDN_BACKWARD=kernel), TileLang's cache brought back.
mkdir -p /tmp/site && tar -xJf .peers/peers.tar.xz -C /tmp/site
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2/record $OUT/c2/gdn $OUT/tl_cache
SECONDS=0
timeout 90 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c2/build.log 2>&1; echo "build rc=$? ${SECONDS}s"; tail -1 $OUT/c2/build.log
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py tests/test_grouped_gemm_gpu.py tests/test_grouped_gemm_swiglu_gpu.py > $OUT/c2/gpu_tests.log 2>&1; echo "tests rc=$? ${SECONDS}s"; tail -1 $OUT/c2/gpu_tests.log
for tool in memcheck racecheck; do
  timeout 100 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py moe > $OUT/c2/san_$tool.log 2>&1; echo "$tool rc=$? ${SECONDS}s"; tail -1 $OUT/c2/san_$tool.log
done
timeout 150 python3 bench/run_all.py --out $OUT/c2/record --benchmarks "grouped gemm" > $OUT/c2/record/run_all.log 2>&1; echo "record rc=$? ${SECONDS}s"
python3 bench/plots.py $OUT/c2/record > /dev/null 2>&1
grep "grouped gemm" $OUT/c2/record/SUMMARY.md | cut -d'|' -f3,4,7
KGEN_GDN_BACKWARD=kernel TILELANG_CACHE_DIR=$OUT/tl_cache timeout $((570 - SECONDS)) python3 bench/run_all.py --out $OUT/c2/gdn --benchmarks "gdn backward" --gdn-peers flashqla > $OUT/c2/gdn/run_all.log 2>&1; echo "gdn rc=$? ${SECONDS}s"
grep "gdn backward" $OUT/c2/gdn/SUMMARY.md | cut -d'|' -f3,4,7
tail -5 $OUT/c2/gdn/run_all.log
cd $OUT && tar czf c2.tgz c2 tl_cache && rm -rf c2 tl_cache
