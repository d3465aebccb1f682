# Session 28 call 2 (tree $1): ncu of the FP8 and bf16 grouped GEMM at Qwen3 gate+up 32768 balanced.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c2
timeout 40 python3 .ab3/s28/ncu_gemm.py --time 2>&1 | tail -2
timeout 100 ncu --set full -k grouped_gemm --launch-skip 2 --launch-count 1 -o $OUT/c2/fp8 python3 .ab3/s28/ncu_gemm.py > $OUT/c2/ncu_fp8.log 2>&1; echo "ncu fp8 rc=$?"
timeout 100 ncu --set full -k grouped_gemm --launch-skip 5 --launch-count 1 -o $OUT/c2/bf16 python3 .ab3/s28/ncu_gemm.py > $OUT/c2/ncu_bf16.log 2>&1; echo "ncu bf16 rc=$?"
for f in fp8 bf16; do ncu --import $OUT/c2/$f.ncu-rep --page details > $OUT/c2/${f}_details.txt 2>&1; grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Executed Ipc A" $OUT/c2/${f}_details.txt | head -12; done
cd $OUT && tar czf c2.tgz c2 && rm -rf c2
