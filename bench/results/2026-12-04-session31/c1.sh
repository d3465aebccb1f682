# Session 31 call 1 (tree $1): ncu SASS-level source counters (stall samples per instruction) of kgen's bf16 grouped
# GEMM at DeepSeek-V3 down 32768 balanced, and of the GDN backward's per-chunk gradients kernel at 8x1k 16/32.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c1
SECONDS=0
ncu --version | tail -1
for what in gemm gdn; do
  if [ $what = gemm ]; then k=regex:grouped_gemm; else k=regex:chunk_grads; fi
  timeout 240 ncu --clock-control none --section SourceCounters --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
     -k $k --launch-skip 1 --launch-count 1 -o $OUT/c1/$what python3 .ab3/s31/ncu_src.py $what > $OUT/c1/$what.log 2>&1
  echo "$what rc=$? ${SECONDS}s"; tail -2 $OUT/c1/$what.log
  ncu --import $OUT/c1/$what.ncu-rep --page source --csv --print-source sass > $OUT/c1/${what}_sass.csv 2> $OUT/c1/${what}_sass.err
  echo "source rc=$? $(wc -c < $OUT/c1/${what}_sass.csv)"; head -c 600 $OUT/c1/${what}_sass.err
  ncu --import $OUT/c1/$what.ncu-rep --page details > $OUT/c1/${what}_details.txt 2>&1
done
ls -la $OUT/c1
cd $OUT && mkdir reps && mv c1/*.ncu-rep reps/ && tar czf c1.tgz c1 && tar czf reps.tgz reps && rm -rf c1 reps
