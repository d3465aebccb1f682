"""Host cost per call of kgen's ops against allocating torch ops in the same process, and where it goes.

Wall time per call over a loop of many calls between two synchronisations, on
inputs so small that the GPU work is a few microseconds (each call's GPU time,
from CUDA graph replays, is shown beside it: a loop whose GPU time came near its
wall time would be throttled by a full launch queue, and is flagged).
Bars (observations, never gates), each against tensors like the op's:
  - op / (``torch.exp(l); torch.add(x, y)``: two allocating torch ops, two launches) <= 1.0;
  - op(out=, lse_out=) / ``torch.add(x, y)`` (one allocating torch op) <= 1.0.
Breakdown (no bars): the same call through ``torch.ops.kgen`` (the custom op torch.compile keeps in
its graphs; eager calls skip its dispatcher), kgen's launcher replayed with the op's recorded launch,
``cuda.core.launch`` with its stream and config prebuilt, ``cuLaunchKernel`` with a
prepacked argument array (for kernels whose arguments are all integers), the
op's result allocations alone, the stream lookup ``kgen.launch.current_stream``.

    PYTHONPATH=. python3 bench/bench_host.py [--out DIR] [--calls 2000] [--host-rounds 5]
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (SUMMARY_COLUMNS, Column, attempt, default_out_dir, environment, markdown_table, summary_row,
                    time_graph, verdict, write_results)

BENCHMARK = "host"
HOST_RATIO_BAR = 1.0
DEVICE_BOUND_SHARE = 0.8  # a loop whose GPU time per call is this share of its wall time measures the GPU
ATTENTION_SEQS, ATTENTION_LEN, HEADS, HEAD_DIM = 4, 64, 8, 128
# The calls every op is measured with; BARS maps a barred call to the torch baseline it is held against.
OP, OP_OUT = "op", "op(out=, lse_out=)"
PAIR, ONE = "torch.exp(l); torch.add(x, y)", "torch.add(x, y)"
BARS = {OP: PAIR, OP_OUT: ONE}
REPLAY = "kgen launcher, the op's launch replayed"

COLUMNS: list[Column] = [
    ("op", "op", None), ("call", "call", None), ("host_us", "wall us/call", ".2f"),
    ("gpu_us_graph", "GPU us/call (graph)", ".2f"), ("ratio", "ratio", ".2f"), ("against", "against", None),
    ("bar", "bar", None), ("verdict", "verdict", None), ("note", "note", None),
]


# ---- the ops and their torch baselines ----------------------------------------------------------------

@dataclass
class OpCase:
    """One op, its allocating and out= calls, and tensors like its inputs for the torch baselines."""
    name: str
    call: Callable[[], Any]
    call_out: Callable[[], Any]
    like_x: torch.Tensor  # shaped like the op's main input (v or q): x and y of torch.add
    like_l: torch.Tensor  # shaped like its lse: l of torch.exp
    allocations: Callable[[], Any]  # the result allocations the op makes, alone
    library_call: Callable[[], Any]  # the same call through torch.ops.kgen, the path torch.compile takes


def exp_and_add(l: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> None:
    """The reference pair: two allocating torch ops, two launches."""
    torch.exp(l)
    torch.add(x, y)


def new_results_like(v: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge ops' two result allocations (``new_empty``, as they make them)."""
    return v.new_empty(v.shape), lse.new_empty(lse.shape)


def empty_results_like(q: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """attention_varlen's two result allocations (``torch.empty``, as it makes them)."""
    return (torch.empty(q.shape, dtype=q.dtype, device=q.device),
            torch.empty(lse.shape, dtype=lse.dtype, device=lse.device))


def merge_case(partials: int) -> OpCase:
    """merge_attention_states (partials == 2) or merge_attention_states_n on 1 token x 8 heads x hd128, bf16."""
    from kgen.ops import merge_attention_states, merge_attention_states_n

    v = torch.randn(partials, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)  # [S, tokens, heads, dim]
    lse = torch.empty(partials, 1, HEADS, device="cuda").uniform_(-5, 5)
    out, lse_out = torch.empty_like(v[0]), torch.empty_like(lse[0])
    allocations = functools.partial(new_results_like, v[0], lse[0])
    if partials == 2:
        return OpCase("merge_attention_states", functools.partial(merge_attention_states, v[0], lse[0], v[1], lse[1]),
                      functools.partial(merge_attention_states, v[0], lse[0], v[1], lse[1], out=out, lse_out=lse_out),
                      v[0], lse[0], allocations,
                      functools.partial(torch.ops.kgen.merge_attention_states, v[0], lse[0], v[1], lse[1]))
    return OpCase(f"merge_attention_states_n (S={partials})", functools.partial(merge_attention_states_n, v, lse),
                  functools.partial(merge_attention_states_n, v, lse, out=out, lse_out=lse_out), v[0], lse[0],
                  allocations, functools.partial(torch.ops.kgen.merge_attention_states_n, v, lse))


def attention_case() -> OpCase:
    """attention_varlen with a plan: 4 causal sequences of 64 tokens, 8 heads, hd128, bf16 (a few us of GPU work)."""
    from kgen.ops import attention_varlen, plan_attention_varlen

    cu_host = [i * ATTENTION_LEN for i in range(ATTENTION_SEQS + 1)]
    plan = plan_attention_varlen(cu_host, cu_host, head_dim=HEAD_DIM, dtype=torch.bfloat16, causal=True, device="cuda")
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn(cu_host[-1], HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out, lse_out = torch.empty_like(q), torch.empty(HEADS, cu_host[-1], device="cuda")
    allocations = functools.partial(empty_results_like, q, lse_out)
    call = functools.partial(attention_varlen, q, k, v, cu, cu, causal=True, plan=plan, return_lse=True)
    library_call = functools.partial(torch.ops.kgen.attention_varlen, q, k, v, cu, cu, plan.work, None, list(plan.recipe),
                                     None)
    return OpCase("attention_varlen (plan, 4 x 64 tokens)", call,
                  functools.partial(call, out=out, lse_out=lse_out), q, lse_out, allocations, library_call)


@dataclass
class Candidate:
    """One timed call of the host-cost table."""
    op: str
    call: str
    fn: Callable[[], Any]
    capturable: bool = False  # whether a CUDA graph can record it (calls bound to one stream cannot)
    #: For a launch that cannot be captured: the call that launches the same kernel on the same arguments,
    #: whose GPU time is this one's too (so a launch loop that fills the queue is flagged as well).
    same_gpu_work_as: str | None = None
    keep: Any = None  # what ``fn`` points into and must outlive it (a prepacked argument array)


# ---- the op's launch, recorded and replayed three ways --------------------------------------------------

@dataclass
class RecordedLaunch:
    launcher: Any  # kgen.launch.KernelLauncher
    grid: int | tuple
    args: tuple  # in the contract's order

    @property
    def named(self) -> dict:
        return {p.name: value for p, value in zip(self.launcher.parameters, self.args)}


def record_launch(op_call: Callable[[], Any]) -> RecordedLaunch:
    """The one ``KernelLauncher`` launch that ``op_call`` makes (launcher, grid, arguments), without launching.
    Its launcher's first launch reaches ``KernelLauncher._launch_values`` with the values in the contract's order
    (later ones call cuda.core directly), so ``op_call`` must not have run before."""
    from kgen.launch import KernelLauncher

    seen: list[RecordedLaunch] = []
    real_launch = KernelLauncher._launch_values
    KernelLauncher._launch_values = lambda self, grid, values: seen.append(RecordedLaunch(self, grid, values))
    try:
        op_call()
    finally:
        KernelLauncher._launch_values = real_launch
    if len(seen) != 1:
        raise RuntimeError(f"expected the op to make one KernelLauncher call, saw {len(seen)}")
    return seen[0]


def grid_3d(grid: int | tuple) -> tuple[int, int, int]:
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(dims) <= 3:
        raise ValueError(f"grid: expected 1 to 3 dimensions, got {grid!r}")
    return (*dims, *(1,) * (3 - len(dims)))


def packed_arguments(args: tuple, sizes: list[int]) -> tuple[ctypes.Array, list]:
    """A ``void*[]`` array pointing at each argument's bytes, as cuLaunchKernel's ``kernelParams`` takes it.

    Python ints become 64-bit integers (as kgen's launcher passes them) and numpy
    scalars keep their own width; each size is checked against the kernel's
    parameter (``sizes``, from ``Kernel.arguments_info``), so a mismatch is an
    error here and never a launch with shifted arguments. Returns the array and
    the buffers it points into, which must outlive it.
    """
    if len(args) != len(sizes):
        raise ValueError(f"args: the kernel takes {len(sizes)} parameters, the launch passed {len(args)}")
    buffers = []
    for i, (arg, size) in enumerate(zip(args, sizes)):
        if isinstance(arg, (int, np.integer, np.floating)) and not isinstance(arg, bool):
            value = np.int64(arg) if isinstance(arg, int) else arg
            data = value.tobytes()
        else:
            raise TypeError(f"args[{i}]: cannot prepack a {type(arg).__name__} (only integers and numpy scalars)")
        if len(data) != size:
            raise ValueError(f"args[{i}]: {len(data)} bytes, the kernel's parameter {i} has {size}")
        buffers.append(ctypes.create_string_buffer(data, len(data)))
    pointers = (ctypes.c_void_p * len(buffers))(*(ctypes.addressof(b) for b in buffers))
    return pointers, buffers


def launch_candidates(op: str, recorded: RecordedLaunch) -> list[Candidate]:
    """The op's launch replayed through kgen's launcher, through cuda.core.launch, and through cuLaunchKernel."""
    from cuda.bindings import driver
    from cuda.core import LaunchConfig, launch
    from kgen.launch import current_stream

    launcher, grid, args, named = recorded.launcher, recorded.grid, recorded.args, recorded.named
    stream = current_stream(launcher.device_index)
    config = LaunchConfig(grid=grid, block=launcher.threads, shmem_size=launcher.dynamic_smem)
    found = [
        Candidate(op, REPLAY, functools.partial(launcher.launch, grid, **named),
                  same_gpu_work_as=OP_OUT),
        Candidate(op, "cuda.core.launch (stream, config prebuilt)",
                  functools.partial(launch, stream, config, launcher.kernel, *args), same_gpu_work_as=OP_OUT),
    ]
    try:
        pointers, buffers = packed_arguments(args, [info.size for info in launcher.kernel.arguments_info])
    except TypeError as exc:  # e.g. TMA descriptors: cuda.core exposes no raw bytes to pack
        print(f"  {op}: cuLaunchKernel skipped: {exc}", file=sys.stderr)
        return found
    function = driver.CUfunction(int(launcher.kernel.handle))  # a CUkernel handle launches as a CUfunction
    prepacked = functools.partial(driver.cuLaunchKernel, function, *grid_3d(grid), launcher.threads, 1, 1,
                                  launcher.dynamic_smem, stream.handle, ctypes.addressof(pointers), 0)
    (err,) = prepacked()
    if err != driver.CUresult.CUDA_SUCCESS:  # checked once: the timed loop repeats the identical launch
        raise RuntimeError(f"{op}: cuLaunchKernel with prepacked arguments failed: {err}")
    found.append(Candidate(op, "cuLaunchKernel (prepacked argument array)", prepacked, same_gpu_work_as=OP_OUT,
                           keep=(pointers, buffers)))
    return found


# ---- measuring ----------------------------------------------------------------------------------------

def wall_us_per_call(fn: Callable[[], Any], calls: int) -> float:
    """Mean wall time per call of a loop of ``calls``, synchronised at both ends so queued work is counted."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def candidates_for(case: OpCase) -> list[Candidate]:
    from kgen.launch import current_stream

    y = torch.randn_like(case.like_x)
    rows = [
        Candidate(case.name, OP, case.call, capturable=True),
        Candidate(case.name, OP_OUT, case.call_out, capturable=True),
        Candidate(case.name, PAIR, functools.partial(exp_and_add, case.like_l, case.like_x, y), capturable=True),
        Candidate(case.name, ONE, functools.partial(torch.add, case.like_x, y), capturable=True),
        Candidate(case.name, "result allocations alone", case.allocations, capturable=True),
        Candidate(case.name, "torch.ops.kgen (torch.compile's path)", case.library_call, capturable=True),
        Candidate(case.name, "stream lookup kgen.launch.current_stream",
                  functools.partial(current_stream, case.like_x.device.index)),
    ]
    return rows + launch_candidates(case.name, record_launch(case.call_out))


def measure(candidates: list[Candidate], calls: int, rounds: int, warmup_calls: int = 200) -> list[dict[str, Any]]:
    """Median wall us per call of each candidate over ``rounds`` interleaved loops, and its GPU us from graph replays."""
    for c in candidates:
        wall_us_per_call(c.fn, warmup_calls)  # first use compiles or loads; keep it out
    samples: dict[int, list[float]] = {i: [] for i in range(len(candidates))}
    for _ in range(rounds):  # interleaved, so drift in clocks or load hits all alike
        for i, c in enumerate(candidates):
            samples[i].append(wall_us_per_call(c.fn, calls))
    rows = []
    for i, c in enumerate(candidates):
        row = {"op": c.op, "call": c.call, "host_us": statistics.median(samples[i]), "host_us_rounds": samples[i],
               "gpu_us_graph": None, "note": None}
        if c.capturable:
            try:
                row["gpu_us_graph"] = time_graph(c.fn, replays_per_sample=50, samples=10) * 1e3
            except Exception as exc:
                row["note"] = f"graph timing failed: {type(exc).__name__}: {exc}"[:200]
        rows.append(row)
    by_key = {(r["op"], r["call"]): r for r in rows}
    for c, row in zip(candidates, rows):
        if c.same_gpu_work_as:
            row["gpu_us_graph"] = by_key[(c.op, c.same_gpu_work_as)]["gpu_us_graph"]
        if row["gpu_us_graph"] is not None and row["gpu_us_graph"] >= DEVICE_BOUND_SHARE * row["host_us"]:
            row["note"] = "device-bound: the GPU time is near the wall time, so this is not the host cost"
    return rows


def with_ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each op's two bars (against the pair and against one op), and each breakdown row as a share of op(out=)."""
    by_key = {(r["op"], r["call"]): r for r in rows}
    out = []
    for r in rows:
        row = dict(r)
        if r["call"] in BARS:
            row["against"] = BARS[r["call"]]
            row["bar"] = f"<= {HOST_RATIO_BAR}"
        elif r["call"] not in (*BARS.values(), OP_OUT):
            row["against"] = OP_OUT
        if "against" in row:
            row["ratio"] = r["host_us"] / by_key[(r["op"], row["against"])]["host_us"]
        if "bar" in row:
            row["verdict"] = verdict(row["ratio"], HOST_RATIO_BAR, False)
        out.append(row)
    return out


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        if "bar" in r:
            metric = f"{r['op']}: {r['call']} / ({r['against']}) ({r['host_us']:.1f} us/call)"
            if r.get("note"):
                metric += f"; {r['note']}"
            out.append(summary_row(BENCHMARK, metric[:300], r["ratio"], "x", r["bar"], r["verdict"]))
        else:
            out.append(summary_row(BENCHMARK, f"{r['op']}: {r['call']}", r["host_us"], "us/call"))
    for op in dict.fromkeys(r["op"] for r in rows):  # what is left of op(out=) once its launch is taken away
        by_call = {r["call"]: r for r in rows if r["op"] == op}
        if REPLAY in by_call and OP_OUT in by_call:
            out.append(summary_row(BENCHMARK, f"{op}: checks and Python around the launch ({OP_OUT} - launcher replay)",
                                   by_call[OP_OUT]["host_us"] - by_call[REPLAY]["host_us"], "us/call"))
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("host cost")
    group.add_argument("--calls", type=int, default=2000, help="calls per host-cost loop (default 2000)")
    group.add_argument("--host-rounds", type=int, default=5, help="loops per call kind; the median is kept (default 5)")


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Measure every op and its baselines in one process; write machinery_host.{json,md}; return the summary rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: the host-cost benchmark needs one")
    errors: list[dict[str, Any]] = []
    candidates: list[Candidate] = []
    for label, make in (("merge_attention_states", lambda: merge_case(2)),
                        ("merge_attention_states_n", lambda: merge_case(4)), ("attention_varlen", attention_case)):
        found = attempt(BENCHMARK, f"{label} setup", errors, lambda: candidates_for(make()))
        candidates += found or []
    print(f"  {len(candidates)} calls, {options.calls} calls x {options.host_rounds} rounds each", flush=True)
    rows = attempt(BENCHMARK, "measuring", errors, measure, candidates, options.calls, max(1, options.host_rounds))
    if not rows:
        return errors
    rows = with_ratios(rows)
    write_results(out_dir, "machinery_host", "kgen host cost per call, against allocating torch ops", rows, COLUMNS,
                  environment(), [
                      f"Wall time per call over {options.calls} calls between two synchronisations, median of "
                      f"{options.host_rounds} interleaved loops, all in one process. Inputs: merge ops 1 token x "
                      f"{HEADS} heads x hd{HEAD_DIM} bf16 per partial; attention {ATTENTION_SEQS} causal sequences of "
                      f"{ATTENTION_LEN} tokens, {HEADS} heads, hd{HEAD_DIM} bf16, with a plan. x, y and l are tensors "
                      f"like the op's main input and its lse. Bars: op / (torch.exp(l); torch.add(x, y)) <= "
                      f"{HOST_RATIO_BAR} and op(out=) / torch.add(x, y) <= {HOST_RATIO_BAR}; the other ratios are "
                      f"against op(out=). 'GPU us/call' is the call captured in a CUDA graph and replayed: the loop "
                      f"measures the host only while it stays well under the wall time.",
                      "Launch rows replay the op's own recorded KernelLauncher call; cuLaunchKernel passes a "
                      "void*[] built once (kernelParams as an address), for kernels whose arguments are all integers."])
    print(markdown_table(rows, COLUMNS))
    return summarise(rows) + errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or bench/results/latest)")
    add_arguments(parser)
    options = parser.parse_args(argv)
    print(markdown_table(run(options.out or default_out_dir(), options), SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
