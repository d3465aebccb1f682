# Session 29 call 4 (tree $1): per-kernel profile of the GDN kernel-path backward (issue 24).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c4
timeout 150 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c4/build.log 2>&1; echo "build rc=$?"; tail -1 $OUT/c4/build.log
timeout 300 python3 .ab3/s29/prof_gdn.py > $OUT/c4/prof.txt 2>&1; echo "prof rc=$?"; cat $OUT/c4/prof.txt | grep -v Warning
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
