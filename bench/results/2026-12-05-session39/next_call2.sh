# The next session's second device call (about 450 s; same carry and timeout as next_call1.sh): the records of the
# tree that won next_call1's A/B and passed its tests (TREE, default ovl) and of old (main's kernels), peers in the
# same run; then Nsight Compute on TREE's plain and fused SwiGLU kernels at Qwen3-MoE gate+up, 32768 tokens balanced:
# where the fused kernel's extra time per tile goes (bench/NOTES.md, thirty-eighth session). Comes back in c2.tgz.
SECONDS=0; DIR=/tmp/c2; TREE=${TREE:-ovl}; source tools/device_lib.sh
build old "$TREE"
record "$TREE"; pack
record old; pack
for op in bf16 swiglu; do
  [ $SECONDS -gt 500 ] && break
  PYTHONPATH=$(tree "$TREE") python3 tools/ncu_grouped_gemm.py --op $op --layer "Qwen3-MoE gate+up" --time
  PYTHONPATH=$(tree "$TREE") timeout $((580 - SECONDS)) ncu --clock-control none --set full -k regex:grouped_gemm --launch-skip 1 \
    --launch-count 1 -o "$DIR/ncu_$op" python3 tools/ncu_grouped_gemm.py --op $op --layer "Qwen3-MoE gate+up" > "$DIR/ncu_$op.log" 2>&1
  echo "ncu $op rc=$? ${SECONDS}s"
  ncu -i "$DIR/ncu_$op.ncu-rep" --page details > "$DIR/ncu_${op}_details.txt" 2>&1
  ncu -i "$DIR/ncu_$op.ncu-rep" --page raw > "$DIR/ncu_${op}_raw.txt" 2>&1
  grep -E "smsp__pcsamp_warps_issue_stalled_[a-z_]+ " "$DIR/ncu_${op}_raw.txt" | sort -k3 -n -r | head -8
  grep -E "Duration|SM Frequency|Compute \(SM\) Throughput|Memory Throughput|Registers Per|Issued Ipc|No Eligible" "$DIR/ncu_${op}_details.txt"
  pack
done
