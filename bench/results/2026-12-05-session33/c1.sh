# Session 33 call 1 (tree $1 = wip/gdn-roles, checked out: the GDN gradients kernel as two warpgroups with their own
# chains of products, on top of wip/gdn-next): backward GPU tests on it, and on wip/gdn-next's tree
# (.ab3/s33/next) if any fails, to tell whose the failure is; then the fwd + bwd step A/B, ABBA over main
# (2e50e63), next (0ab4265) and roles.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
ROLES=/tmp/site:$PWD:$PWD/tests:$PWD/bench
NEXT=/tmp/site:$PWD/.ab3/s33/next:$PWD/.ab3/s33/next/tests:$PWD/bench  # with its own tests
MAIN=/tmp/site:$PWD/.ab3/s33/main:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
SECONDS=0
for t in ROLES NEXT MAIN; do
  PYTHONPATH=${!t} timeout 60 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c1/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; tail -1 $OUT/c1/build_$t.log
done
# A hang of the new kernel's named barriers would eat the call: one small backward first, under a short timeout.
PYTHONPATH=$ROLES timeout 60 python3 .ab3/s33/smoke.py > $OUT/c1/smoke_roles.log 2>&1; smoke=$?; echo "smoke roles rc=$smoke ${SECONDS}s"; cat $OUT/c1/smoke_roles.log | tail -6
if [ $smoke -ne 0 ]; then
  PYTHONPATH=$NEXT timeout 60 python3 .ab3/s33/smoke.py > $OUT/c1/smoke_next.log 2>&1; echo "smoke next rc=$? ${SECONDS}s"; tail -6 $OUT/c1/smoke_next.log
fi
[ $smoke -eq 0 ] && PYTHONPATH=$ROLES timeout 200 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gdn_chunk_backward_gpu.py > $OUT/c1/gpu_tests_roles.log 2>&1; rc=$?; [ $smoke -ne 0 ] && rc=1; echo "tests roles rc=$rc ${SECONDS}s"; tail -1 $OUT/c1/gpu_tests_roles.log; grep -E "^FAILED" $OUT/c1/gpu_tests_roles.log | head
if [ $rc -ne 0 ]; then
  PYTHONPATH=$NEXT timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider .ab3/s33/next/tests/test_gdn_chunk_backward_gpu.py > $OUT/c1/gpu_tests_next.log 2>&1; echo "tests next rc=$? ${SECONDS}s"; tail -1 $OUT/c1/gpu_tests_next.log; grep -E "^FAILED" $OUT/c1/gpu_tests_next.log | head
fi
gdn() { PYTHONPATH=${!1} timeout 60 python3 .ab3/s33/gdn_ab.py $1 >> $OUT/c1/gdn_ab.jsonl 2>> $OUT/c1/ab.err; echo "gdn $1 rc=$? ${SECONDS}s"; }
[ $smoke -eq 0 ] && order="MAIN NEXT ROLES ROLES NEXT MAIN" || order="MAIN NEXT NEXT MAIN"
for t in $order; do [ $SECONDS -gt 540 ] && break; gdn $t; done
tail -3 $OUT/c1/ab.err
cd $OUT && tar czf c1.tgz c1 && rm -rf c1
