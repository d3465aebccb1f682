# Session 24 call 7: ncu of the single-warpgroup prefill item at L = 2, 64 and 128 (what bounds a short item).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c7
for L in 2 64 128; do
timeout 60 ncu --profile-from-start off --kernel-name regex:attention_prefill --launch-count 1 --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section MemoryWorkloadAnalysis --metrics smsp__inst_executed.sum,smsp__warps_launched.sum,sm__cycles_elapsed.avg,dram__bytes.sum python3 ncu_case.py (here) $L > $OUT/c7/ncu_L$L.txt 2>&1; echo "L=$L rc=$?"
done
grep -h -E "^[0-9]+ |Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Achieved Occupancy|inst_executed|warps_launched|dram__bytes|Stall|Registers Per" $OUT/c7/ncu_L*.txt | cut -c1-150
