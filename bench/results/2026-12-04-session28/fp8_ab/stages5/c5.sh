# Session 28 call 5 (tree $1): the FP8 grouped GEMM at 5 stages (st5/: HEAD with the spec's FP8 config at stages 5)
# against 4 (mid/: HEAD): FP8 GPU tests on st5, A/B.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
MID=/tmp/site:$PWD/.ab3/s28/mid:$PWD/tests:$PWD/bench
ST5=/tmp/site:$PWD/.ab3/s28/st5:$PWD/tests:$PWD/bench
export PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c5
(cd .ab3/s28/st5 && PYTHONPATH=/tmp/site:$PWD timeout 60 python3 -m kgen build --family grouped_gemm -j 16 -q > $OUT/c5/build_st5.log 2>&1; echo "build st5 rc=$?"; tail -1 $OUT/c5/build_st5.log)
PYTHONPATH=$ST5 timeout 60 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_grouped_gemm_fp8_gpu.py > $OUT/c5/gpu_tests_st5.log 2>&1; echo "tests rc=$?"; tail -1 $OUT/c5/gpu_tests_st5.log
for round in 1 2; do for tree in MID ST5; do
  [ $round = 2 ] && tree=$([ $tree = MID ] && echo ST5 || echo MID)
  PYTHONPATH=${!tree} timeout 40 python3 .ab3/s28/probe_gemm.py > $OUT/c5/probe_${tree}_$round.txt 2>&1; echo "$tree $round rc=$?"; cut -c1-80 $OUT/c5/probe_${tree}_$round.txt
done; done
cd $OUT && tar czf c5.tgz c5 && rm -rf c5
