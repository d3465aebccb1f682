# Session 25 call 4: ncu of the planner's prefill call (64x64, three blocks an SM, grouped order) at L = 128, 256 and 512.
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1
mkdir -p $OUT/c4
for L in 128 256 512; do
timeout 90 ncu --profile-from-start off --kernel-name regex:attention_prefill --launch-count 1 --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --metrics smsp__inst_executed.sum,dram__bytes.sum,lts__t_sector_hit_rate.pct,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.sum python3 bench/results/2026-12-03-session24/ncu/ncu_case.py $L > $OUT/c4/ncu_L$L.txt 2>&1; echo "L=$L rc=$?"
grep -h -E "Duration|DRAM Throughput|Compute \(SM\) Throughput|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Achieved Occupancy|inst_executed|dram__bytes|hit_rate|gmma|Stall|Executed Ipc A" $OUT/c4/ncu_L$L.txt | cut -c1-150
done
