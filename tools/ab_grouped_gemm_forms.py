"""The grouped GEMM's kernel forms against each other in one process, ABBA over rounds, at issue 26's prefill
shapes: the op's own choice (built_in), single blocks and clusters of two sharing B tiles whatever the rows, and
FP8's 128 x 128 tile (tests/specs/grouped_gemm_fp8_narrow) and its 128 x 256 tile in clusters
(tests/specs/grouped_gemm_fp8_cluster), each folder put ahead of the built-in spec. Run with one form under each of
two trees' kgen on PYTHONPATH, it is an A/B of the trees (the first JSON line names the kgen it imported).

    python3 tools/ab_grouped_gemm_forms.py [--rounds 2] [--tokens 4096,32768] [--routing balanced,zipf] [--forms a,b]
                                           [--calls bf16,fp8,swiglu_fp8_out] [--folder NAME=SPEC_FOLDER ...]

Each JSON line: round, form, case, bf16 / fused SwiGLU+FP8 / FP8 TFLOP/s (bench/common.time_cuda, L2 flushed), and
the largest difference of the form's results from the first form's (a form that computes the same products in
the same order gives 0), and each result's float64 sum (equal sums across trees: most likely equal results). Inputs
are made once per shape.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import torch

import kgen
from kgen import config
from kgen.ops import grouped_gemm, grouped_gemm_swiglu, quantize_fp8_blockwise

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from bench_grouped_gemm import LAYERS, TOP_K, group_sizes  # noqa: E402
from common import time_cuda  # noqa: E402
from fp8_blocks import quantize_weights  # noqa: E402
from grouped_gemm_kernels import taking_clusters  # noqa: E402

SPECS = ROOT / "tests" / "specs"
#: Per form: the spec folder put ahead of the built-in one, and clusters taken (True), not (False), or by the op.
FORMS = {"built_in": (None, None), "single_blocks": (None, False), "clusters": (None, True),
         "fp8_narrow": (SPECS / "grouped_gemm_fp8_narrow", None), "fp8_cluster": (SPECS / "grouped_gemm_fp8_cluster", True)}


@contextlib.contextmanager
def taking(form: str):
    spec_path, clusters = FORMS[form]
    with config.overrides(KGEN_SPEC_PATH=spec_path and str(spec_path)), \
            (contextlib.nullcontext() if clusters is None else taking_clusters(clusters)):
        yield


def shape_inputs(experts: int, n: int, k: int, tokens: int, routing: str) -> dict:
    rows = tokens * TOP_K
    offs = group_sizes(rows, experts, routing, torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
    torch.manual_seed(0)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / 64
    a8, a_scale = quantize_fp8_blockwise(a)
    b8, b_scale = quantize_weights(b)
    return {"a": a, "b": b, "offs": offs, "a8": a8, "a_scale": a_scale, "b8": b8, "b_scale": b_scale,
            "flops": 2 * rows * n * k}


def measure(x: dict, gate_up: bool, names: list[str]) -> tuple[dict, dict]:
    """TFLOP/s of each call named, and its results."""
    calls = {"bf16": lambda: grouped_gemm(x["a"], x["b"], x["offs"]),
             "fp8": lambda: grouped_gemm(x["a8"], x["b8"], x["offs"], a_scale=x["a_scale"], b_scale=x["b_scale"])}
    if gate_up:  # b as stacked gate and up rows: the output has half the columns, the same FLOPs
        calls["swiglu_fp8_out"] = lambda: grouped_gemm_swiglu(x["a"], x["b"], x["offs"], quantize_out=True)[0]
    calls = {name: call for name, call in calls.items() if name in names}
    results = {name: call() for name, call in calls.items()}
    speeds = {name: round(x["flops"] / time_cuda(call, warmup_ms=50, rep_ms=300) / 1e9, 1) for name, call in calls.items()}
    return speeds, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", default="4096,32768")
    parser.add_argument("--routing", default="balanced")
    parser.add_argument("--forms", default=",".join(FORMS), help="the forms to run, in the first round's order")
    parser.add_argument("--calls", default="bf16,fp8,swiglu_fp8_out", help="the ops to time (SwiGLU's at gate+up only)")
    parser.add_argument("--folder", action="append", default=[], metavar="NAME=SPEC_FOLDER",
                        help="one more form: a spec folder put ahead of the built-in one (repeatable)")
    args = parser.parse_args()
    for extra in args.folder:
        name, _, folder = extra.partition("=")
        FORMS[name] = (Path(folder).resolve(), None)
    forms = args.forms.split(",")
    print(json.dumps({"kgen": kgen.__file__}), flush=True)  # which tree an A/B of trees measured
    for model, projection, experts, n, k in LAYERS:
        for tokens in map(int, args.tokens.split(",")):
            for routing in args.routing.split(","):
                x = shape_inputs(experts, n, k, tokens, routing)
                case = f"{model} {projection} {tokens} {routing}"
                reference = None
                for round_ in range(args.rounds):
                    order = forms if round_ % 2 == 0 else forms[::-1]
                    for form in order:
                        with taking(form):
                            speeds, results = measure(x, projection == "gate+up", args.calls.split(","))
                        if reference is None:  # the first form measured: forms[0] in round 0
                            reference = results
                        differs = {name: float((results[name].float() - reference[name].float()).abs().nan_to_num(0).max())
                                   for name in results} if reference is not None else {}
                        print(json.dumps({"round": round_, "form": form, "case": case, **speeds, "max_diff": differs,
                                          "sum": {name: float(value.double().sum()) for name, value in results.items()}}),
                              flush=True)
                del x
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
