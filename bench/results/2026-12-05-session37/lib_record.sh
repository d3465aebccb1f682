# What session 37's calls added to ../2026-12-05-session35/next_lib.sh (their .ab3/s36/lib.sh was that file with this
# function appended; d12.sh and d13.sh also stop the sanitizers at 400 s rather than 540).
# The grouped GEMM record (bench/run_all.py, peers in the same run) of tree $1 at commit $2, into $DIR/record_$1.
record() {
  mkdir -p $DIR/record_$1
  PYTHONPATH=$(tree $1) KGEN_COMMIT=$2 timeout 150 python3 bench/run_all.py --out $DIR/record_$1 --benchmarks "grouped gemm" > $DIR/record_$1/run_all.log 2>&1
  echo "record $1 rc=$? ${SECONDS}s"
  grep "grouped gemm" $DIR/record_$1/SUMMARY.md | grep FAIL | cut -d'|' -f3,4,7
}
