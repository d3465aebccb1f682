# Session 24 call 6: 64x96 and 64x80 in the built-in spec: build, GPU tests, probes at unmeasured picks, the record.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$(git rev-parse HEAD)
mkdir -p $OUT/c6
(python3 -m kgen build --family attention_prefill -j 16 && KGEN_SPEC_PATH=tests/specs/neighbours python3 -m kgen build --family attention_prefill -j 16) > $OUT/c6/build.log 2>&1; echo "build rc=$?"; grep summary $OUT/c6/build.log
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_gpu.py tests/test_neighbour_variants_gpu.py > $OUT/c6/gpu_tests_attention.log 2>&1; echo "tests rc=$?"; tail -2 $OUT/c6/gpu_tests_attention.log
timeout 100 python3 tools/prefill_tile_probe.py --lengths 80,160,192 --shapes wgmma:64:64,wgmma:64:80,wgmma:64:96 --rounds 2 > $OUT/c6/probe.txt 2>&1; echo "probe rc=$?"
timeout 300 python3 bench/run_all.py --out $OUT/c6 --benchmarks "attention,attention sweep" > /dev/null 2>&1; echo "bench rc=$?"; grep -i "kgen/cuDNN\|cliff" $OUT/c6/SUMMARY.md | sed 's/| x |.*//' | cut -c1-200
cat $OUT/c6/probe.txt | cut -c1-100
