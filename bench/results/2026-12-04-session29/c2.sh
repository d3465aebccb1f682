# Session 29 call 2 (tree $1): tools/ab_grouped_gemm_forms.py, the three forms ABBA.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2
timeout 560 python3 tools/ab_grouped_gemm_forms.py $2 > $OUT/c2/forms.jsonl 2> $OUT/c2/forms.err; echo "forms rc=$?"; tail -5 $OUT/c2/forms.err
cat $OUT/c2/forms.jsonl
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
