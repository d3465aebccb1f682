# The copy bandwidth two ways on 1 GiB of bf16: copy_ captured in a CUDA graph (what bench_grouped_gemm used up to
# session 37) and copy_ timed call by call (a kernel; what it uses now and what the merge bench times).
import sys
sys.path.insert(0, "bench")
import common  # noqa: F401
import torch
from common import time_cuda, time_graph
src = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda"); dst = torch.empty_like(src)
moved = 2 * src.numel() * src.element_size()
print({"graph_tbs": moved / time_graph(lambda: dst.copy_(src), replays_per_sample=10) / 1e9,
       "call_tbs": moved / time_cuda(lambda: dst.copy_(src), warmup_ms=50, rep_ms=200) / 1e9})
