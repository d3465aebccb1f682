"""Bad-input audit of kgen's public ops, planners and compat drop-ins on a CUDA GPU (a second one adds cases):

    python3 tools/bad_input_matrix.py [-k SUBSTR] [-x SUBSTR]   # exit 1 on any problem; --list: names, no GPU

Each case changes one argument of a valid call of small shapes. clear: ValueError/TypeError naming the argument
(or one it is checked against); unclear: another type, or no such name; crash: a CUDA error in the case or in the
valid call run after it (a sticky one stops the run); accepted:legit: no error, and the result keeps the docs'
promise (the valid call's result, documented NaN rows...); accepted:WRONG: no error where a refusal is due, or a
broken promise; refused-valid: a documented-valid input refused. A case's name is printed, flushed, before it
runs: after an abort or a hang (ended after HANG_S s) the last one is the culprit (rerun with -x NAME).
"""

from __future__ import annotations

import argparse
import faulthandler
import math
import re
import sys
from collections import Counter
from pathlib import Path
from typing import Callable, NamedTuple

import torch

try:
    import kgen  # noqa: F401
except ImportError:  # a checkout without an install
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kgen import ops  # noqa: E402
from kgen.compat import fla, flash_attn, flashinfer  # noqa: E402

DEV, BF16, F32, I32, INF = "cuda", torch.bfloat16, torch.float32, torch.int32, math.inf
HANG_S = 300  # seconds a case (and the valid call after it) may take: a first call compiles its kernels
PROBLEMS = ("unclear", "crash", "accepted:WRONG", "refused-valid")

class Skip(Exception):
    """The case needs what this machine lacks (a second GPU)."""

class Lazy(NamedTuple):  # a value made when the case runs, from the valid arguments: listing needs no GPU
    label: str
    make: Callable

# ---- What acceptance must look like. A check takes (result, ref, base); ref() gives the valid call's result. ----
def _tensors(r):
    if isinstance(r, torch.Tensor):
        yield r
    for x in r if isinstance(r, (tuple, list)) else ():
        yield from _tensors(x)

def same(tol=2e-2, pick=lambda r: r):
    """Legitimate iff the result is the valid call's: layouts that keep the values, documented conversions."""
    def check(res, ref, base):
        a, b = list(_tensors(pick(res))), list(_tensors(pick(ref())))
        if [x.shape for x in a] != [y.shape for y in b]:
            return False, "result shapes differ from the valid call's"
        bad = [i for i, (x, y) in enumerate(zip(a, b))
               if not torch.allclose(x.double().cpu(), y.double().cpu(), rtol=tol, atol=tol, equal_nan=True)]
        return not bad, f"results {bad} differ from the valid call's" if bad else "same result as the valid call"
    return check

def nan_at(pick, what):
    """The documented NaN-for-bad-rows policy: pick(result) gives (tensors all NaN, tensors with no NaN)."""
    def check(res, ref, base):
        bad, good = pick(res)
        ok = all(t.isnan().all().item() for t in bad) and not any(t.isnan().any().item() for t in good)
        return ok, f"documented NaN at {what}, the rest finite" if ok else f"expected NaN at {what} and only there"
    return check

def NO_NAN(res, ref, base):  # an accepted empty or odd-but-valid input: whatever comes out must not be NaN
    found = any(t.is_floating_point() and t.isnan().any().item() for t in _tensors(res))
    return not found, "NaN in the result" if found else "no NaN in the result"

R = ("refuse", None)  # a refusal is due
def documented(note): return lambda res, ref, base: (True, note)  # noqa: E704
def either(check=None): return ("either", check or same())  # noqa: E704 a clear refusal, or accepted and checked
def must(check=None): return ("must", check or same())  # noqa: E704 documented valid: accepted and checked

# ---- Generic mutations of one tensor argument. ----
ALT = {"h": (F32, torch.float16), "f": (BF16, torch.float64), "i": (torch.int64, F32), "l": (I32, F32)}

def _other_gpu(t):
    if torch.cuda.device_count() < 2:
        raise Skip("needs a second GPU")
    return t.to(f"cuda:{torch.cuda.device_count() - 1}")

def _misaligned(t):  # the same values, the data pointer one element past an allocation's (aligned) start
    return torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)[1:].view(t.shape).copy_(t)

def _resize(t, dim, n):  # shape[dim] -> n; an extra slice repeats the first
    return torch.cat([t, t.narrow(dim, 0, 1)], dim) if n > t.shape[dim] else t.narrow(dim, 0, n).clone()

def tensor_mutations(rank, kind, role):
    """(label, how, expectation); role '' a required input, '?' an optional one, '>' an output."""
    out = [(f"dtype={str(d)[6:]}", lambda t, d=d: t.to(d), R) for d in ALT[kind]]
    out += [("cpu", lambda t: t.cpu(), R), ("other_gpu", _other_gpu, R), ("rank+1", lambda t: t.unsqueeze(0), R),
            ("rank-1", lambda t: t[0], R)]
    for i in range(rank):  # an empty input may be fine (an empty result); an output of the wrong shape never is
        out += [(f"dim{i}+1", lambda t, i=i: _resize(t, i, t.shape[i] + 1), R),
                (f"dim{i}=0", lambda t, i=i: _resize(t, i, 0), R if role == ">" else either(NO_NAN))]
    if rank >= 2:  # the same values in other layouts: accepted is fine if the result is the valid call's
        out += [("transposed", lambda t: t.transpose(-1, -2).contiguous().transpose(-1, -2), either()),
                ("padded_rows", lambda t: torch.cat([t, torch.zeros_like(t)], -1)[..., :t.shape[-1]], either())]
    out += [("strided", lambda t: torch.stack([t, t], -1)[..., 0], either()), ("offset+1", _misaligned, either())]
    if kind in "hf" and role != ">":  # no backward: checks.refuse_grad says such tensors are refused, not detached
        out.append(("requires_grad", lambda t: t.detach().clone().requires_grad_(), R))
    return out + ([("None", lambda t: None, R)] if role == "" else []) + [("list", lambda t: t.tolist(), R)]

class Case(NamedTuple):
    op: str
    name: str
    fn: Callable
    base: Callable[[], dict]  # fresh valid arguments, seeded: the same values each time
    mutate: Callable[[dict], dict]  # the valid arguments -> the changed ones
    expect: tuple
    names: tuple  # the argument names a clear message may name

    def run(self): return (lambda a: self.fn(**{**a, **self.mutate(a)}))(self.base())  # noqa: E704
    def ref(self): return self.fn(**self.base())  # noqa: E704

def X(label, upd, exp=R, names=None):
    """A case: ``upd`` maps the valid arguments to the changes, or is a dict of them (Lazy values made then)."""
    if not callable(upd):
        upd = (lambda u: lambda a: {k: v.make(a) if isinstance(v, Lazy) else v for k, v in u.items()})(upd)
    return label, upd, exp, tuple((names or re.split(r"[=.]", label)[0]).split())

def bad(arg, *values, exp=R, names=None):
    return [X(f"{arg}={v.label if isinstance(v, Lazy) else repr(v)}", {arg: v}, exp, names) for v in values]

def cases_for(op, fn, build, specs="", extras=(), opt=None, peers="", overrides=None, prefix=""):
    """specs: 'arg:<rank><kind><role>' per tensor argument (kind h 16-bit float, f fp32, i int32, l int64); opt:
    makers of valid values of arguments the base call leaves out; peers: arguments checked against each other."""
    opt, overrides, group = opt or {}, overrides or {}, peers.split()
    for spec in specs.split():
        arg, shape = spec.split(":")
        base = (lambda arg=arg: (lambda a: {**a, **opt[arg](a)})(build())) if arg in opt else build
        for label, how, exp in tensor_mutations(int(shape[0]), shape[1], shape[2:]):
            yield Case(op, f"{op}.{prefix}{arg}.{label}", fn, base, lambda a, arg=arg, how=how: {arg: how(a[arg])},
                       overrides.get(f"{arg}.{label}", exp), (arg, *group) if arg in group else (arg,))
    for label, upd, exp, names in extras:
        yield Case(op, f"{op}.{prefix}{label}", fn, build, upd, exp, names)

def scales(arg, legit=("neg", "zero", "subnormal")):  # check_scale (the gated delta rule) takes any finite fp32
    return [X(f"{arg}={k}", {arg: v}, either(NO_NAN) if k in legit else R) for k, v in {
        "nan": math.nan, "inf": INF, "-inf": -INF, "neg": -1.0, "zero": 0.0, "bool": True, "str": "0.1", "huge": 1e39,
        "subnormal": 1e-46, "tensor": Lazy("", lambda a: torch.tensor(0.1, device=DEV))}.items()]

def flags(arg, *values): return bad(arg, *(values or (1, "yes", None)))  # noqa: E704 bools are bools (as causal's)
def _r(*shape, dtype=BF16, scale=1.0): return torch.randn(shape, device=DEV, dtype=dtype) * scale  # noqa: E704
def _i(values, dtype=I32): return torch.tensor(values, dtype=dtype, device=DEV)  # noqa: E704
def _cu(label, values): return Lazy(label, lambda a: _i(values))  # noqa: E704
def _noplan(upd): return lambda a: {"plan": None, **(upd(a) if callable(upd) else X("", upd)[1](a))}  # noqa: E704

OTHER_GPU = Lazy("other_gpu", lambda a: _other_gpu(torch.empty(0, device=DEV)).device)
PADDED_OK = {f"{t}.padded_rows": must() for t in ("q", "k", "v", "k_cache", "v_cache")}  # only D must be contiguous
# ---- attention_varlen and flash-attn's drop-in: an empty sequence, one with keys and no queries, tails. ----
CU_Q, CU_K = [0, 5, 5, 42], [0, 9, 12, 49]
MOVED = either(nan_at(lambda r: ([r[5:]], [r[:5]]), "rows 5: (the sequences whose bounds moved)"))
def _attn_plan(cu_q=CU_Q, cu_k=CU_K, **kw):
    return ops.plan_attention_varlen(cu_q, cu_k, **{"head_dim": 128, "device": DEV, **kw})

def attn_build():
    torch.manual_seed(0)
    return dict(q=_r(42, 4, 128), k=_r(49, 2, 128), v=_r(49, 2, 128), cu_seqlens_q=_i(CU_Q), cu_seqlens_k=_i(CU_K),
                plan=_attn_plan())

def attention_cases():
    plan = lambda label, *a, **kw: Lazy(label, lambda _: _attn_plan(*a, **kw))  # noqa: E731
    qkv = lambda d: lambda a: dict(q=_r(42, 4, d), k=_r(49, 2, d), v=_r(49, 2, d))  # noqa: E731
    warm = lambda upd: lambda a: (ops.attention_varlen(**a), upd(a))[1]  # noqa: E731 the plan's fast path checks too
    extras = [
        *flags("causal"), *flags("return_lse", "no"), *scales("softmax_scale", ()), *bad("window", [-1, -1], exp=either()),
        *bad("window", (1.5, -1), (True, -1), (-2, -1), (2**40, -1), (3,), None),
        *bad("window", (8, -1), names="plan window"),
        *bad("plan", "plan", Lazy("DecodePlan", lambda a: _dec_plan()), plan("head_dim64", head_dim=64),
             plan("fp16", dtype=torch.float16), plan("causal", causal=True),
             plan("more_seqs", [0, 5, 5, 40, 42], [0, 9, 12, 40, 49]),  # a plan is tied to one device (its arch)
             Lazy("other_gpu", lambda a: _attn_plan(device=OTHER_GPU.make(a)))),
        *bad("plan", plan("other_totals", [0, 5, 5, 43]), names="plan q"),
        *bad("plan", plan("moved_key_bounds", CU_Q, [0, 9, 13, 49]), exp=MOVED),
        *bad("cu_seqlens_k", _cu("moved", [0, 9, 13, 49]), exp=MOVED),
        *bad("cu_seqlens_q", _cu("past_tensors", [0, 1005, 1005, 1042]), exp=either(nan_at(lambda r: ([r], []), "all"))),
        *(X(f"cu_seqlens_q={k}_noplan", _noplan({"cu_seqlens_q": _cu("", v)}), names="cu_seqlens_q q") for k, v in
          (("decreasing", [0, 5, 3, 42]), ("nonzero_start", [1, 5, 5, 42]), ("past_tensors", [0, 5, 5, 1042]))),
        X("head_dim=80_noplan", _noplan(qkv(80))), X("head_dim=64_plan128", qkv(64), names="plan head_dim"),
        X("warm.q.offset+1", warm(lambda a: {"q": _misaligned(a["q"])}), either(), "q"),
        X("warm.out.offset+1", warm(lambda a: {"out": _misaligned(torch.zeros_like(a["q"]))}), either(), "out")]
    opt = {"sink": lambda a: {"sink": _r(4, dtype=F32)}, "out": lambda a: {"out": torch.zeros_like(a["q"])},
           "lse_out": lambda a: {"lse_out": torch.zeros(4, 42, device=DEV), "return_lse": True}}
    yield from cases_for("attention_varlen", ops.attention_varlen, attn_build, "q:3h k:3h v:3h cu_seqlens_q:1i "
                         "cu_seqlens_k:1i sink:1f? out:3h> lse_out:2f>", extras, opt, "q k v plan", PADDED_OK)
    extras = [*bad("dropout_p", 0.1, "x"), *bad("softcap", 1.0, "x"), *bad("causal", 1), *scales("softmax_scale")[:2],
              *bad("softcap", -1.0, exp=must()), *bad("window_size", (-5, -7), exp=must()),  # documented: off, unbounded
              *bad("max_seqlen_q", "x", exp=must()), *bad("deterministic", True, exp=must()),  # documented: unused
              *bad("alibi_slopes", _cu("tensor", [1.0] * 4)), *bad("block_table", _cu("tensor", [[0]])),
              *bad("window_size", (1.5, -1), 5), *bad("cu_seqlens_k", _cu("decreasing", [0, 9, 8, 49])),
              *bad("cu_seqlens_q", _cu("past_tensors", [0, 5, 5, 1042]), names="cu_seqlens_q q")]
    yield from cases_for("compat.flash_attn_varlen_func", flash_attn.flash_attn_varlen_func, lambda: {
        k: v for k, v in attn_build().items() if k != "plan"} | dict(max_seqlen_q=37, max_seqlen_k=37),
        "q:3h k:3h cu_seqlens_q:1i", extras, peers="q k v", overrides=PADDED_OK)

# ---- attention_decode: a request with no keys, one with a tail; contiguous and paged caches. ----
SEQ = [40, 0, 17]
def _dec_plan(seqlens=SEQ, **kw):
    return ops.plan_attention_decode(seqlens, **{"num_heads_q": 8, "num_heads_kv": 2, "head_dim": 128, "device": DEV,
                                                 **kw})
def _row_nan(b): return either(nan_at(lambda r: ([r[b]], [r[x] for x in range(3) if x != b]), f"request {b}"))  # noqa
def _gapped(t): return torch.cat([t, torch.zeros_like(t)], 1)[:, :t.shape[1]]  # noqa: E704 pages apart in memory

def dec_build(paged=False):
    torch.manual_seed(0)
    cache = (8, 16) if paged else (3, 64)
    a = dict(q=_r(3, 8, 128), k_cache=_r(*cache, 2, 128), v_cache=_r(*cache, 2, 128), seqlens_k=_i(SEQ),
             plan=_dec_plan(page_size=16 if paged else None))
    return {**a, "block_table": _i([[0, 1, 2, 7], [3, 3, 3, 3], [4, 5, 6, 6]])} if paged else a

def _zero_or_nan(res, ref, base):  # docs: a length below Lq has no key (0 out); negative lengths are not named
    ok = bool((res[0] == 0).all() or res[0].isnan().all()) and not res[1:].isnan().any()
    return ok, "request 0 is 0 or NaN, the rest finite" if ok else "request 0 neither 0 nor NaN, or NaN elsewhere"

def decode_cases():
    op, fn, plan = "attention_decode", ops.attention_decode, lambda label, **kw: Lazy(label, lambda a: _dec_plan(**kw))
    page = lambda b, j, p: lambda a: {"block_table": a["block_table"].index_put(  # noqa: E731
        (_i([b]).long(), _i([j]).long()), _i([p]))}
    extras = [
        *bad("q", Lazy("lq9", lambda a: _r(3, 9, 8, 128)), names="plan q"), *scales("softmax_scale", ()),
        *bad("window_left", -2, 1.5, True, 2**40, -1.0, 8, None, names="window_left plan"), *flags("return_lse", "no"),
        *(X(f"window_left={w!r}_noplan", _noplan({"window_left": w})) for w in (-2, 1.5, True)),
        *bad("plan", "plan", Lazy("AttentionPlan", lambda a: _attn_plan()), plan("B2", seqlens=[40, 0]),
             plan("fp16", dtype=torch.float16), plan("Hkv4", num_heads_kv=4), plan("head_dim64", head_dim=64),
             plan("window8", window_left=8), plan("paged16", page_size=16)),
        *bad("plan", plan("max_seqlen_k100", max_seqlen_k=100), names="plan k_cache"),
        *bad("plan", Lazy("other_gpu", lambda a: _dec_plan(device=OTHER_GPU.make(a))), exp=either()),  # a workspace each
        *bad("seqlens_k", _cu("past_capacity", [10000, 0, 17]), exp=_row_nan(0)),
        *bad("seqlens_k", _cu("negative", [-5, 0, 17]), exp=either(_zero_or_nan)),
        *(X(f"seqlens_k={k}_noplan", _noplan({"seqlens_k": _cu("", v)}), names="seqlens_k k_cache")
          for k, v in (("past_capacity", [10000, 0, 17]), ("negative", [-5, 0, 17]))),
        X("k_cache,v_cache=interleaved", lambda a: dict(zip(("k_cache", "v_cache"), torch.stack(
            [a["k_cache"], a["v_cache"]], 2).unbind(2))), must(), "k_cache")]  # documented: views of one cache are fine
    opt = {"sink": lambda a: {"sink": _r(8, dtype=F32)}, "out": lambda a: {"out": torch.zeros_like(a["q"])}}
    yield from cases_for(op, fn, dec_build, "q:3h k_cache:4h v_cache:4h seqlens_k:1i sink:1f? out:3h>", extras, opt,
                         "q k_cache v_cache plan", PADDED_OK)
    paged = [X("block_table=page_out_of_range", page(0, 1, 1000), _row_nan(0)),
             X("block_table=page_negative", page(2, 0, -1), _row_nan(2)),
             X("block_table=unused_entry_garbage", page(2, 3, 1 << 30), must()),  # entries past a request's pages
             *bad("plan", plan("contiguous"), names="plan page_size"),
             X("k_cache=page_size8", lambda a: {"k_cache": _r(16, 8, 2, 128), "v_cache": _r(16, 8, 2, 128)},
               names="plan k_cache page_size"),
             X("k_cache=pages_apart", lambda a: {"k_cache": _gapped(a["k_cache"]), "v_cache": _gapped(a["v_cache"])},
               either(), "k_cache")]
    yield from cases_for(op, fn, lambda: dec_build(paged=True), "block_table:2i", paged, prefix="paged.",
                         overrides={"block_table.dim1+1": must(), "block_table.padded_rows": must()})

# ---- merge_attention_states(_n) and FlashInfer's merge_state(s): 28 rows, not a whole tile. ----
def merge_build(names=("v_a", "lse_a", "v_b", "lse_b")):
    torch.manual_seed(0)
    return dict(zip(names, (_r(7, 4, 128), _r(7, 4, dtype=F32), _r(7, 4, 128), _r(7, 4, dtype=F32))))

def merge_n_build(names=("v", "lse"), dim=0):  # FlashInfer stacks the states on dim 1, kgen on dim 0
    torch.manual_seed(0)
    return {n: t.transpose(0, dim).contiguous() for n, t in zip(names, (_r(3, 7, 4, 128), _r(3, 7, 4, dtype=F32)))}

EMPTY = either(lambda res, ref, base: (bool((res[0] == 0).all() and (res[1] == -INF).all()),
                                      "documented for empty partials: v 0, lse -inf"))

#: The merges take states in any of their dtypes (bf16, fp16, fp32): one stacked tensor of another is valid.
STATE_DTYPES = {f"v.dtype={d}": must() for d in ("float32", "float16")}

def merge_cases():
    minf = lambda *names: lambda a: {n: torch.full_like(a[n], -INF) for n in names}  # noqa: E731
    strides = lambda *args: {f"{s}.{m}": must() for s in args for m in ("transposed", "strided", "padded_rows")}  # noqa
    out = lambda v, lse: {"out": lambda a: {"out": torch.zeros_like(v(a))},  # noqa: E731
                          "lse_out": lambda a: {"lse_out": torch.zeros_like(lse(a))}}
    extras = [X("lse_a,lse_b=all_-inf", minf("lse_a", "lse_b"), EMPTY),  # documented: empty partials
              X("head_dim=80", lambda a: {"v_a": _r(7, 4, 80), "v_b": _r(7, 4, 80)}, names="head_dim v_a")]
    yield from cases_for("merge_attention_states", ops.merge_attention_states, merge_build,
                         "v_a:3h lse_a:2f v_b:3h lse_b:2f out:3h> lse_out:2f>", extras,
                         out(lambda a: a["v_a"], lambda a: a["lse_a"]), "v_a v_b", strides("lse_a", "lse_b"))
    extras = [X("v,lse=S0", lambda a: {"v": a["v"][:0], "lse": a["lse"][:0]}, EMPTY, "v"),
              X("lse=all_-inf", minf("lse"), EMPTY), X("head_dim=80", lambda a: {"v": _r(3, 7, 4, 80)}, names="head_dim v")]
    yield from cases_for("merge_attention_states_n", ops.merge_attention_states_n, merge_n_build, "v:4h lse:3f out:3h> "
                         "lse_out:2f>", extras, out(lambda a: a["v"][0], lambda a: a["lse"][0]),
                         overrides={**strides("lse"), **STATE_DTYPES})
    conv = {f"{s}.dtype={d}": must(same(5e-2)) for s in ("s_a", "s") for d in ("bfloat16", "float64")}  # any float
    yield from cases_for("compat.flashinfer.merge_state", flashinfer.merge_state, lambda: merge_build(
        ("v_a", "s_a", "v_b", "s_b")), "v_a:3h s_a:2f v_b:3h", bad("s_a", Lazy("int32", lambda a: a["s_a"].int())),
        peers="v_a v_b", overrides=conv)
    yield from cases_for("compat.flashinfer.merge_states", flashinfer.merge_states, lambda: merge_n_build(("v", "s"), 1),
                         "v:4h s:3f", overrides={**conv, **STATE_DTYPES})

# ---- chunk_gated_delta_rule and fla's drop-ins: packed varlen, an empty sequence, a tail chunk. ----
CU_G = [0, 70, 70, 100]
STATE0 = {"initial_state": lambda a: {"initial_state": _r(3, 4, 128, 128, dtype=F32, scale=0.1)}}
def _gdn_plan(cu=CU_G, **kw): return ops.plan_chunk_gated_delta_rule(cu, **{"num_heads_v": 4, "device": DEV, **kw})  # noqa
def _as_b2(a): return {n: a[n].view(2, 50, *a[n].shape[2:]) for n in ("q", "k", "v", "g", "beta")}  # noqa: E704

def gdn_build(batch=1, tokens=100, plan=True):  # T = 100: packed varlen by CU_G; else B sequences of T
    torch.manual_seed(0)
    a = dict(q=_r(batch, tokens, 2, 128), k=_r(batch, tokens, 2, 128), v=_r(batch, tokens, 4, 128),
             g=-0.1 * torch.rand(batch, tokens, 4, device=DEV), beta=torch.rand(batch, tokens, 4, device=DEV),
             output_final_state=True, use_qk_l2norm_in_kernel=True)
    return {**a, "cu_seqlens": _i(CU_G), **({"plan": _gdn_plan()} if plan else {})} if tokens == 100 else a

def _gdn_nan(bad_t, bad_s, good_t, good_s, what):  # o [1, T, HV, V] by token, final states by sequence
    return either(nan_at(lambda r: ([r[0][0, bad_t], r[1][bad_s]], [r[0][0, good_t], r[1][good_s]]), what))

SEQ01_NAN = _gdn_nan(slice(0, 70), slice(0, 2), slice(70, 100), slice(2, 3), "sequences 0 and 1")

def gdn_cases():
    plan = lambda label, *a, **kw: Lazy(label, lambda _: _gdn_plan(*a, **kw))  # noqa: E731
    qkv = lambda d: lambda a: dict(q=_r(1, 100, 2, d), k=_r(1, 100, 2, d), v=_r(1, 100, 4, d))  # noqa: E731
    extras = [
        *flags("output_final_state"), *flags("use_qk_l2norm_in_kernel"), *bad("state_layout", "xy", None), *scales("scale"),
        *bad("plan", "plan", Lazy("AttentionPlan", lambda a: _attn_plan()), plan("HV2", num_heads_v=2),
             plan("head_dim64", head_dim=64), plan("other_totals", [0, 70, 70, 101])),
        *bad("plan", Lazy("other_gpu", lambda a: _gdn_plan(device=OTHER_GPU.make(a))), exp=either()),  # tables per device
        *bad("plan", plan("moved_bounds", [0, 60, 70, 100]), exp=SEQ01_NAN),
        *bad("plan", plan("segment_chunks1", segment_chunks=1), exp=must(same(5e-2))),
        *bad("cu_seqlens", _cu("moved", [0, 70, 71, 100]),
             exp=_gdn_nan(slice(70, 100), slice(1, 3), slice(0, 70), slice(0, 1), "sequences 1 and 2")),
        *bad("cu_seqlens", _cu("past_tensors", [0, 210, 210, 300]),
             exp=_gdn_nan(slice(None), slice(None), slice(0, 0), slice(0, 0), "every token and state")),
        X("cu_seqlens=with_B2", _as_b2),
        X("cu_seqlens=decreasing_noplan", _noplan({"cu_seqlens": _cu("", [0, 70, 60, 100])})),
        X("plan=varlen_without_cu_seqlens_B2", lambda a: {**_as_b2(a), "cu_seqlens": None}),
        X("head_dim=96_noplan", _noplan(qkv(96))), X("head_dim=64_plan128", qkv(64), names="plan head_dim"),
        X("g=positive", lambda a: {"g": torch.rand_like(a["g"])}, either(documented("g <= 0 is documented, unchecked")))]
    yield from cases_for("chunk_gated_delta_rule", ops.chunk_gated_delta_rule, gdn_build,
                         "q:4h k:4h v:4h g:3f beta:3f cu_seqlens:1i initial_state:4f? out:4h>", extras,
                         {**STATE0, "out": lambda a: {"out": torch.zeros_like(a["v"])}}, "q k v plan",
                         {"cu_seqlens.dtype=int64": must(), "beta.dtype=bfloat16": must(same(5e-2))})  # documented
    conv = {f"{s}.dtype={d}": must(same(5e-2)) for s in ("g", "beta", "initial_state") for d in ("bfloat16", "float64")}
    extras = [*bad("chunk_size", 128), *bad("chunk_size", 32, exp=must(same(5e-2))), *bad("head_first", True),
              *bad("foo", 1), *bad("cp_context", Lazy("object", lambda a: object())), *bad("allow_neg_eigval", True),
              *bad("use_gate_in_kernel", True, names="A_log"), *scales("scale")[:2],
              *bad("cu_seqlens_cpu", Lazy("cuda", lambda a: a["cu_seqlens"])),
              *bad("cu_seqlens_cpu", [0, 60, 70, 100], exp=SEQ01_NAN)]  # other values than cu_seqlens: kgen's policy
    yield from cases_for("compat.fla.chunk_gated_delta_rule", fla.chunk_gated_delta_rule, lambda: (lambda a: {
        **a, "cu_seqlens": a["cu_seqlens"].long()})(gdn_build(plan=False)), "q:4h g:3f beta:3f cu_seqlens:1l "
        "initial_state:4f?", extras, STATE0, "q k v", {**conv, "cu_seqlens.dtype=int32": must(),
        "cu_seqlens.None": must(documented("as in fla: without cu_seqlens, B sequences of T tokens"))})
    extras = [*bad("gk", Lazy("tensor", lambda a: a["g"])), *bad("gv", Lazy("tensor", lambda a: a["v"].float())),
              *bad("beta", Lazy("per_channel", lambda a: torch.rand(3, 1, 4, 128, device=DEV))), *bad("foo", 1)]
    copied = {f"initial_state.{m}": must() for m in ("dtype=bfloat16", "dtype=float64", "transposed", "strided",
                                                      "padded_rows", "offset+1")}  # the drop-in copies it into fp32
    copied |= {"initial_state.cpu": either(), "initial_state.other_gpu": either()}  # a copy from anywhere: correct
    yield from cases_for("compat.fla.fused_recurrent_gated_delta_rule", fla.fused_recurrent_gated_delta_rule,
                         lambda: {**gdn_build(3, 1), "initial_state": _r(3, 4, 128, 128, dtype=F32, scale=0.1)},
                         "q:4h initial_state:4f?", extras, peers="q k v", overrides=copied)  # T = 1: kgen's step

# ---- gated_delta_rule_step: a padded slot (-1), a pool larger than the batch. ----
def step_build():
    a = gdn_build(3, 1)
    return {**{n: a[n][:, 0] for n in ("q", "k", "v", "g", "beta")}, "state": _r(5, 4, 128, 128, dtype=F32, scale=0.1),
            "state_indices": _i([4, -1, 1]), "use_qk_l2norm_in_kernel": True}

def _step(**a): return ops.gated_delta_rule_step(**a), a.get("state")  # noqa: E704 the pool is a result too

def _bad_slot(res, ref, base):  # documented: o NaN for that sequence, the pool untouched (rows 0-3 as the valid call's)
    (o, state), (_, valid) = res, ref()
    ok = bool(o[0].isnan().all() and (o[1] == 0).all() and not o[2].isnan().any() and torch.equal(state[:4], valid[:4]))
    return ok, "documented: o[0] NaN, the pool untouched" if ok else "expected o[0] NaN, o[1] 0, pool rows 0-3 as valid"

def step_cases():
    extras = [*bad("state_indices", _cu("out_of_range", [7, -1, 1]), _cu("-2", [-2, -1, 1]), exp=either(_bad_slot)),
              *bad("state_indices", _cu("duplicate", [1, -1, 1]), exp=either(documented("documented as undefined"))),
              X("state=small_pool_no_indices", lambda a: {"state": a["state"][:2].clone(), "state_indices": None}),
              *bad("state_layout", "xy", None), *scales("scale"), *flags("use_qk_l2norm_in_kernel"),
              X("head_dim=96", lambda a: dict(q=_r(3, 2, 96), k=_r(3, 2, 96), v=_r(3, 4, 96),
                                               state=_r(5, 4, 96, 96, dtype=F32)), names="head_dim q")]
    overrides = {"beta.dtype=bfloat16": must(same(5e-2)), "state.dim0+1": must(same(pick=lambda r: (r[0], r[1][:5]))),
                 "state.dim0=0": either(nan_at(lambda r: ([r[0][0], r[0][2]], [r[0][1]]), "sequences 0, 2 (no pool)")),
                 "state_indices.None": either(NO_NAN)}  # documented: sequence b then uses row b
    yield from cases_for("gated_delta_rule_step", _step, step_build, "q:3h k:3h v:3h g:2f beta:2f state:4f "
                         "state_indices:1i out:3h>", extras, {"out": lambda a: {"out": torch.zeros_like(a["v"])}},
                         "q k v", overrides)

# ---- The planners: host data in, a plan out. ----
def planner_cases():
    devices = bad("device", "cpu", "tpu", Lazy("cuda:<count>", lambda a: f"cuda:{torch.cuda.device_count()}"))
    pages = lambda table, **kw: {"page_size": 16, "block_table": table, "num_pages": 8, **kw}  # noqa: E731
    yield from cases_for("plan_attention_varlen", ops.plan_attention_varlen, lambda: dict(
        cu_seqlens_q=CU_Q, cu_seqlens_k=CU_K, head_dim=128, device=DEV), extras=[
        *bad("head_dim", 128.0, True, -1, 2**40, 80, "128"), *bad("dtype", F32, "bf16"), *devices, *bad("causal", 1),
        *bad("tail", "bogus"), *bad("tile_m", 7, 64.0), *bad("mma", "bogus"), *bad("window", (1.5, -1), (-2, -1)),
        *bad("cu_seqlens_q", [0, 5.0, 42], [1, 5, 42], [0, 5, 3], [], None, [0, 2**40], _cu("cuda_tensor", CU_Q),
             Lazy("2d_tensor", lambda a: torch.tensor([CU_Q]))),
        *bad("cu_seqlens_q", [0, 5, 42], names="cu_seqlens_q cu_seqlens_k")])
    yield from cases_for("plan_attention_decode", ops.plan_attention_decode, lambda: dict(
        seqlens_k=SEQ, num_heads_q=8, num_heads_kv=2, head_dim=128, device=DEV), extras=[
        *bad("seqlens_k", [40, -1], [40, 1.5], None, Lazy("2d_tensor", lambda a: torch.tensor([SEQ])),
             _cu("cuda_tensor", SEQ)),  # docs: host data
        *bad("num_heads_q", 7, 0, 8.0), *bad("num_heads_kv", 0, 3, True), *bad("q_len", 0, 9), *bad("tail", "bogus"),
        *bad("head_dim", 80, -1, 128.0), *bad("page_size", 0, 16.0), *bad("kv_load", "bogus"), *bad("dtype", F32),
        X("kv_load=tma,page_size=5", {"kv_load": "tma", "page_size": 5}, names="kv_load page_size"), *devices,
        *bad("max_seqlen_k", 10, -1, 40.0), *bad("window_left", -2, 1.5), *bad("num_sms", 0, 132.0),
        X("block_table=page_out_of_range", pages([[0, 1, 99], [0, 0, 0], [4, 5, 6]])),
        X("block_table=ragged", pages([[0, 1, 2], [3], [4, 5]])), X("block_table=too_few_pages", pages([[0], [1], [2]])),
        X("block_table=without_num_pages", pages([[0, 1, 2]] * 3, num_pages=None), names="block_table num_pages"),
        X("block_table=contiguous_cache", pages([[0, 1, 2]] * 3, page_size=None)),
        X("block_table=float_tensor", pages(Lazy("", lambda a: torch.zeros(3, 3))))])
    yield from cases_for("plan_chunk_gated_delta_rule", ops.plan_chunk_gated_delta_rule, lambda: dict(
        cu_seqlens=CU_G, num_heads_v=4, head_dim=128, device=DEV), extras=[*devices, *bad("num_sms", 0),
        *bad("cu_seqlens", [0, 70, 60], [1, 70], [0, 70.0], None, [], _cu("cuda_tensor", CU_G)), *bad("tile_n", 7),
        *bad("num_heads_v", 0, 4.0, 2**20), *bad("head_dim", 96, 128.0, True), *bad("segment_chunks", 0, 1.5)])

def all_cases() -> list[Case]:
    cases = [c for cases in (attention_cases, decode_cases, merge_cases, gdn_cases, step_cases, planner_cases)
             for c in cases()]
    assert len({c.name for c in cases}) == len(cases), "case names must be unique"
    return cases

# ---- Running and classifying. ----
CUDA_ERROR = re.compile(r"CUDA error|CUDA driver|illegal (memory|address|instruction)|misaligned address|"
                        r"launch failure|device-side assert|cudaError|CUDA_ERROR", re.I)
def _cuda_error(e): return type(e).__name__ == "AcceleratorError" or bool(CUDA_ERROR.search(str(e)))  # noqa: E704

def classify(case: Case, exc, res) -> tuple[str, str]:
    mode, check = case.expect
    if exc is None and check is None:
        return "accepted:WRONG", "accepted; a refusal naming " + "/".join(case.names) + " is due"
    if exc is None:
        try:
            ok, note = check(res, case.ref, case.base)
        except Exception as e:  # noqa: BLE001 - a result the check cannot read fails it
            return ("crash" if _cuda_error(e) else "accepted:WRONG"), f"check failed: {type(e).__name__}: {e}"
        return ("accepted:legit" if ok else "accepted:WRONG"), note
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    if _cuda_error(exc) or mode == "must":
        return ("crash" if _cuda_error(exc) else "refused-valid"), text
    named = any(re.search(rf"(?<!\w){re.escape(n)}(?!\w)", str(exc)) for n in case.names)
    internal = type(exc).__name__ == "LaunchArgumentError"  # the launcher's own check: kgen's checks let it through
    return ("clear" if isinstance(exc, (ValueError, TypeError)) and named and not internal else "unclear"), text

def run_case(case: Case) -> tuple[str, str]:
    """The case, then a synchronize and the op's valid call: a CUDA error there, or NaN, makes it a crash."""
    faulthandler.dump_traceback_later(HANG_S, exit=True)
    try:
        exc = res = None
        try:
            res = case.run()
        except Skip as s:
            return "skipped", str(s)
        except Exception as e:  # noqa: BLE001
            exc = e
        cls, text = classify(case, exc, res)
        try:
            torch.cuda.synchronize()
            nan = any(t.is_floating_point() and t.isnan().any().item() for t in _tensors(case.ref()))
            return ("crash", f"the valid call after it gives NaN (the case: {text})") if nan else (cls, text)
        except Exception as e:  # noqa: BLE001
            return "crash", f"the valid call after it failed: {type(e).__name__}: {e} (the case: {text})"
    finally:
        faulthandler.cancel_dump_traceback_later()

def alive() -> bool:
    try:
        return torch.ones(1, device=DEV).add_(1).item() == 2.0
    except Exception:  # noqa: BLE001 - a sticky CUDA error
        return False

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print the case names and counts (needs no GPU)")
    parser.add_argument("-k", action="append", default=[], help="only cases whose name contains this (repeatable)")
    parser.add_argument("-x", action="append", default=[], help="skip cases whose name contains this (repeatable)")
    args = parser.parse_args()
    cases = [c for c in all_cases() if (not args.k or any(s in c.name for s in args.k))
             and not any(s in c.name for s in args.x)]
    per_op = Counter(c.op for c in cases)
    if args.list:
        print("\n".join([c.name for c in cases] + [f"# {op}: {n}" for op, n in per_op.items()]))
        print(f"# total: {len(cases)}")
        return 0
    if not torch.cuda.is_available():
        sys.exit("no CUDA device: run this on a GPU machine (or use --list)")
    faulthandler.enable()
    for op in per_op:  # the valid calls first: they compile the kernels, and a failure here is the harness's own
        print(f"valid call: {op}", flush=True)
        next(c for c in cases if c.op == op).ref()
    torch.cuda.synchronize()
    rows, stopped = [], ""
    for i, case in enumerate(cases):
        print(f"[{i + 1}/{len(cases)}] {case.name}", flush=True)
        rows.append((case, *run_case(case)))
        if rows[-1][1] == "crash" and not alive():  # a sticky error fails every later call: stop, report what ran
            stopped = f"sticky CUDA error after {case.name}: stopped; rerun with -x '{case.name}' to go past it"
            break
    width = max((len(c.name) for c, _, _ in rows), default=4)
    print(f"\n{'case':<{width}}  {'class':<15}  message")
    print("\n".join(f"{c.name:<{width}}  {cls:<15}  {text[:100]}" for c, cls, text in rows))
    total = Counter(cls for _, cls, _ in rows)
    print(f"\nsummary ({len(rows)} of {len(cases)} run): " + ", ".join(f"{k} {n}" for k, n in sorted(total.items())))
    for op in per_op:
        print(f"  {op}: " + ", ".join(f"{k} {n}" for k, n in sorted(Counter(r[1] for r in rows if r[0].op == op).items())))
    print(stopped)
    return 1 if stopped or any(total[p] for p in PROBLEMS) else 0

if __name__ == "__main__":
    sys.exit(main())
