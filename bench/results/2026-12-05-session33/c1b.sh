python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
ROLES=/tmp/site:$PWD:$PWD/tests:$PWD/bench
NEXT=/tmp/site:$PWD/.ab3/s33/next:$PWD/.ab3/s33/next/tests:$PWD/.ab3/s33/oldbench/bench
MAIN=/tmp/site:$PWD/.ab3/s33/main:$PWD/tests:$PWD/.ab3/s33/oldbench/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1b
SECONDS=0
for t in ROLES NEXT MAIN; do PYTHONPATH=${!t} timeout 60 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > /dev/null 2>&1; done; echo "build ${SECONDS}s"
gdn() { PYTHONPATH=${!1} timeout 60 python3 .ab3/s33/gdn_ab.py $1 >> $OUT/c1b/gdn_ab.jsonl 2>> $OUT/c1b/ab.err; echo "gdn $1 rc=$? ${SECONDS}s"; }
for t in MAIN NEXT ROLES ROLES NEXT MAIN; do gdn $t; done
tail -3 $OUT/c1b/ab.err
for tool in memcheck racecheck; do
  PYTHONPATH=$ROLES timeout 150 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/c1b/san_$tool.log 2>&1; echo "$tool rc=$? ${SECONDS}s"; tail -2 $OUT/c1b/san_$tool.log
done
for t in MAIN ROLES; do [ $SECONDS -gt 520 ] && break; PYTHONPATH=${!t} timeout 60 python3 .ab3/s33/gdn_kernels.py $t >> $OUT/c1b/gdn_kernels.jsonl 2>> $OUT/c1b/ab.err; echo "kernels $t rc=$? ${SECONDS}s"; done
cd $OUT && tar czf c1b.tgz c1b && rm -rf c1b
