# Session 31 call 5 (tree $1): the grouped GEMM's raster groups of 4 and 16 row tiles against 8 (HEAD), ABBA over
# processes, balanced routing; ncu source counters of the fused SwiGLU+FP8 kernel (Qwen3-MoE gate+up, 4096 tokens
# balanced) and of the GDN backward's reverse recurrence (8x1k 16/32), for the next steps.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
OLD=/tmp/site:$PWD:$PWD/tests:$PWD/bench
R4=/tmp/site:$PWD/.ab3/s31/r4:$PWD/tests:$PWD/bench
R16=/tmp/site:$PWD/.ab3/s31/r16:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c5
SECONDS=0
for t in OLD R4 R16; do PYTHONPATH=${!t} timeout 100 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c5/build_$t.log 2>&1; echo "build $t rc=$? ${SECONDS}s"; done
run() { PYTHONPATH=${!1} timeout 100 python3 tools/ab_grouped_gemm_forms.py --rounds 1 --forms built_in --routing $2 >> $OUT/c5/ab_$1.jsonl 2>> $OUT/c5/ab.err; echo "$1 $2 rc=$? ${SECONDS}s"; }
run OLD balanced; run R4 balanced; run R16 balanced; run R16 balanced; run R4 balanced; run OLD balanced
for what in swiglu gdn; do
  if [ $what = swiglu ]; then k=regex:grouped_gemm; else k=regex:chunk_reverse; fi
  PYTHONPATH=$OLD timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
     -k $k --launch-skip 1 --launch-count 1 -o $OUT/c5/$what python3 .ab3/s31/ncu_src.py $what > $OUT/c5/ncu_$what.log 2>&1; echo "ncu $what rc=$? ${SECONDS}s"
  ncu --import $OUT/c5/$what.ncu-rep --page source --csv --print-source sass 2>/dev/null | gzip > $OUT/c5/${what}_sass.csv.gz
  ncu --import $OUT/c5/$what.ncu-rep --page details > $OUT/c5/${what}_details.txt 2>&1; rm -f $OUT/c5/$what.ncu-rep
done
tail -3 $OUT/c5/ab.err
cd $OUT && tar czf c5.tgz c5 && rm -rf c5
