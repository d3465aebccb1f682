# Session 30 call 4 (tree $1): ncu (clocks not locked) of kgen's and torch's bf16 grouped GEMM at DeepSeek-V3's down
# projection, 32768 tokens balanced, where kgen is 0.89x torch.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c4
SECONDS=0
timeout 60 python3 .ab3/s30/ncu_down.py --time 2>&1 | tail -2
timeout 300 ncu --clock-control none --set full --nvtx --nvtx-include "profile/" -o $OUT/c4/down python3 .ab3/s30/ncu_down.py > $OUT/c4/ncu.log 2>&1; echo "ncu rc=$? ${SECONDS}s"; tail -3 $OUT/c4/ncu.log
ncu --import $OUT/c4/down.ncu-rep --page details > $OUT/c4/details.txt 2>&1
ncu --import $OUT/c4/down.ncu-rep --page raw --csv > $OUT/c4/raw.csv 2>&1
grep -E "^  [a-zA-Z_]|Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|L2 Cache Throughput|DRAM Throughput|Registers Per|Achieved Occupancy|Executed Ipc A|Grid Size|Block Size|Dynamic Shared" $OUT/c4/details.txt | head -80
rm -f $OUT/c4/down.ncu-rep
cd $OUT && tar czf c4.tgz c4 && rm -rf c4
