# Session 23 call 2: sanitizers (attention + GDN incl. the backward), then the prefill epilogue A/B on seed 000's shapes.
mkdir -p $OUT/c2
for tool in memcheck racecheck; do timeout 170 compute-sanitizer --tool $tool --report-api-errors no python3 tools/sanitizer_case.py attention_and_gated_delta_rule > $OUT/c2/san_$tool.log 2>&1; echo "rc=$?"; tail -3 $OUT/c2/san_$tool.log; done
base=$PYTHONPATH
for t in pre_epi . pre_epi .; do PYTHONPATH=$PWD/.ab3/$t:$base timeout 120 python3 tools/ab_kernels.py --label $t --only prefill 2>&1 | grep -v Warn; done | tee $OUT/c2/prefill_ab.txt
