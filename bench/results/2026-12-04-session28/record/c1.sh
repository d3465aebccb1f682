# Session 28 call 1 (tree $1): build, the attention GPU tests, the record (attention + sweep), ncu of the grouped GEMM.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1/record
timeout 150 python3 -m kgen build -j 16 -q > $OUT/c1/build.log 2>&1; echo "build rc=$?"; tail -2 $OUT/c1/build.log
timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_attention_plan.py > $OUT/c1/gpu_tests.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c1/gpu_tests.log
timeout 260 python3 bench/run_all.py --out $OUT/c1/record --benchmarks "attention,attention sweep" > $OUT/c1/record/run_all.log 2>&1; echo "record rc=$?"
python3 bench/plots.py $OUT/c1/record > /dev/null 2>&1
grep -A40 "sweep" $OUT/c1/record/SUMMARY.md | head -60
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
