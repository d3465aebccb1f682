# Session 26 call 6: the attention record at 0412475 (packed tiles), run_all's attention and sweep.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
python3 -m kgen build --family attention_prefill --arch sm_90a -j 16 -q > /dev/null 2>&1
timeout 480 python3 bench/run_all.py --out $OUT/record --benchmarks "attention,attention sweep" > $OUT/record_run_all.log 2>&1; echo run_all rc=$?
grep -E "cliff" $OUT/record/SUMMARY.md | cut -c1-200
cd $OUT && tar czf record.tgz record record_run_all.log && rm -rf record
