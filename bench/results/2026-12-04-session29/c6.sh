# Session 29 call 6 (tree $1): ncu of the GDN per-chunk gradients kernel (8 x 1024, 16/32).
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl 2>/dev/null
export PYTHONPATH=/tmp/site:$PWD:$PWD/tests:$PWD/bench PYTHONUNBUFFERED=1 KGEN_COMMIT=$1
mkdir -p $OUT/c6
timeout 120 python3 -m kgen build --family gated_delta_rule_chunk --family gated_delta_rule_kkt -j 16 -q > $OUT/c6/build.log 2>&1; echo "build rc=$?"
timeout 200 ncu --set full -k gated_delta_rule_chunk_grads --launch-skip 1 --launch-count 1 -o $OUT/c6/grads python3 .ab3/s29/ncu_grads.py > $OUT/c6/ncu.log 2>&1; echo "ncu rc=$?"; tail -3 $OUT/c6/ncu.log
ncu --import $OUT/c6/grads.ncu-rep --page details > $OUT/c6/details.txt 2>&1
grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|DRAM Throughput|L1/TEX Hit|Registers Per|Achieved Occupancy|Executed Ipc A|Shared Memory|Bank|Warp Cycles Per Issued|Issue Slots Busy|One or More Eligible|No Eligible|stall|Stall" $OUT/c6/details.txt | head -40
ncu --import $OUT/c6/grads.ncu-rep --page raw --csv 2>/dev/null | python3 -c "
import csv,sys
rows=list(csv.reader(sys.stdin)); h=rows[0]; v=rows[2]
for k,x in zip(h,v):
    if any(s in k for s in ('smsp__average_warp_latency_issue_stalled','smsp__average_warps_issue_stalled','pipe_shared','l1tex__data_pipe_lsu_wavefronts_mem_shared','sm__pipe_tensor','smsp__inst_executed_pipe')) and x not in ('0','0.00'):
        print(k, x)
" | sort -t' ' -k2 -gr 2>/dev/null | head -40
cd $OUT && tar czf c6.tgz c6 && rm -rf c6
