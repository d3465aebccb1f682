# Session 24 call 4: the record of step 2b: the dense attention table and seed 000's sweep, peers in the same run.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=$PWD:/tmp/site:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$(git rev-parse HEAD)
mkdir -p $OUT/c4
timeout 570 python3 bench/run_all.py --out $OUT/c4 --benchmarks "attention,attention sweep" > /dev/null 2>&1; echo "bench rc=$?"; grep -i "kgen/cuDNN\|cliff\|t(2\^" $OUT/c4/SUMMARY.md | head -70
