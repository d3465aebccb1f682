"""The seed sweep's tables, bars and summary rows, from the rows bench_attention_sweep measured.

Pure functions of those rows (no GPU), so they can be checked on any machine.
A sweep row holds, for each tail policy p: ``ms_p``, ``tile_m_p``, ``padded_len_p``,
``padded_ms_p``, ``over_padded_p``; for each peer: ``ms_<peer>``, ``<peer>_status``,
``kgen_over_<peer>`` (t(kgen, default tail) / t(peer)); and ``L``, ``seqs``,
``default_tail``, ``correct`` or ``error``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from common import Column, markdown_table, summary_row, verdict, write_results

NAME = "bench_attention_sweep"  # bench_attention_sweep.json / .md / .png
TAIL_BAR = 1.02  # t(tail) / t(the same sequences padded to whole tiles) <= 1.02
BOUNDARY_BAR = 1.01  # t(2^k - 1) <= 1.01 t(2^k)
BOUNDARY_KS = range(6, 12)  # k = 6..11: the bar's and the cliff's powers of two
PEERS = {"varlen": "torch varlen_attn", "cudnn": "cuDNN dense [N, H, L, D]"}


def boundary_pairs(lengths: list[int]) -> list[tuple[int, int, int]]:
    """(k, 2^k - 1, 2^k) for every k of BOUNDARY_KS with both lengths in ``lengths``."""
    present = set(lengths)
    return [(k, (1 << k) - 1, 1 << k) for k in BOUNDARY_KS if {(1 << k) - 1, 1 << k} <= present]


def cliff_rows(sweep: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """t(2^k + 1) / t(2^k) for each k of BOUNDARY_KS measured at both lengths, for kgen's policies and the peers."""
    by_length = {r["L"]: r for r in sweep if "error" not in r}
    rows = []
    for k in BOUNDARY_KS:
        at, above = by_length.get(1 << k), by_length.get((1 << k) + 1)
        if at is None or above is None:
            continue
        row: dict[str, Any] = {"k": k, "at": at["L"], "above": above["L"]}
        for name in [*policies, *PEERS]:
            if at.get(f"ms_{name}") and above.get(f"ms_{name}"):
                row[f"cliff_{name}"] = above[f"ms_{name}"] / at[f"ms_{name}"]
        rows.append(row)
    return rows


# ---- tables -------------------------------------------------------------------------------------------

def latency_columns(policies: list[str]) -> list[Column]:
    return [("L", "L", "d"), ("seqs", "N", "d"), ("tokens", "tokens", "d"), ("timer", "timer", None),
            *[(f"ms_{p}", f"kgen {p} ms", ".4f") for p in policies],
            *[(f"ms_{peer}", f"{label} ms", ".4f") for peer, label in PEERS.items()],
            *[(f"kgen_over_{peer}", f"t(kgen)/t({label})", ".3f") for peer, label in PEERS.items()],
            ("input_sets", "sets", "d"), ("spread_pct", "spread %", ".1f"), ("rel_l2", "kgen rel L2 (fp64)", ".1e"),
            ("correct", "correct", None), *[(f"{peer}_status", f"{peer}", None) for peer in PEERS],
            ("error", "error", None)]


def tail_columns(policies: list[str]) -> list[Column]:
    columns: list[Column] = [("L", "L", "d")]
    for p in policies:
        columns += [(f"tile_m_{p}", f"{p} tile_m", "d"), (f"padded_len_{p}", f"{p} padded L", "d"),
                    (f"ms_{p}", f"{p} ms", ".4f"), (f"padded_ms_{p}", f"{p} padded ms", ".4f"),
                    (f"over_padded_{p}", f"{p} tail/padded", ".3f"), (f"verdict_{p}", f"{p} verdict", None)]
    return columns


def cliff_columns(policies: list[str]) -> list[Column]:
    return [("k", "k", "d"), ("above", "2^k+1", "d"), ("at", "2^k", "d"),
            *[(f"cliff_{name}", f"{PEERS.get(name, 'kgen ' + name)}", ".3f") for name in [*policies, *PEERS]]]


BOUNDARY_COLUMNS: list[Column] = [
    ("policy", "policy", None), ("k", "k", "d"), ("below", "2^k-1", "d"), ("at", "2^k", "d"),
    ("ms_below", "t(2^k-1) ms", ".4f"), ("ms_at", "t(2^k) ms", ".4f"), ("ratio", "t(2^k-1)/t(2^k)", ".3f"),
    ("ratio_min", "min", ".3f"), ("ratio_max", "max", ".3f"), ("rounds", "rounds", "d"), ("verdict", "verdict", None),
    ("correct", "correct", None), ("error", "error", None),
]


def with_tail_verdicts(sweep: list[dict[str, Any]], policies: list[str]) -> list[dict[str, Any]]:
    """The sweep rows with ``verdict_p`` per policy: the tail bar's PASS/FAIL, WRONG if the length's output was."""
    rows = []
    for r in sweep:
        row = dict(r)
        for p in policies:
            row[f"verdict_{p}"] = ("WRONG" if r.get("correct") == "WRONG" else
                                   verdict(r.get(f"over_padded_{p}"), TAIL_BAR, False) if "error" not in r else "ERROR")
        rows.append(row)
    return rows


def with_boundary_verdicts(bounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**b, "verdict": "ERROR" if b.get("error") else "WRONG" if b.get("correct") == "WRONG"
             else verdict(b.get("ratio"), BOUNDARY_BAR, False)} for b in bounds]


# ---- summary rows -------------------------------------------------------------------------------------

def tail_summary_rows(row: dict[str, Any], policies: list[str]) -> list[dict[str, Any]]:
    out = []
    for p in policies:
        default = " (default)" if p == row["default_tail"] else ""
        metric = (f"sweep L={row['L']} tail={p}{default}: t/t(padded L={row[f'padded_len_{p}']}, tile_m "
                  f"{row[f'tile_m_{p}']}) ({row[f'ms_{p}']:.4f} vs {row[f'padded_ms_{p}']:.4f} ms)")
        out.append(summary_row("attention sweep", metric, row[f"over_padded_{p}"], "x", f"<= {TAIL_BAR}",
                               row[f"verdict_{p}"]))
    return out


def peer_summary_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    default = row["default_tail"]
    for peer, label in PEERS.items():
        metric = f"sweep L={row['L']}: t(kgen {default})/t({label})"
        if row.get(f"kgen_over_{peer}") is not None:
            metric += f" ({row['ms_' + default]:.4f} vs {row['ms_' + peer]:.4f} ms)"
        else:
            metric += f": {row.get(f'{peer}_status', 'not measured')}"
        out.append(summary_row("attention sweep", metric[:300], row.get(f"kgen_over_{peer}"), "x"))
    return out


def cliff_summary_rows(cliffs: list[dict[str, Any]], default_tail: str) -> list[dict[str, Any]]:
    out = []
    for c in cliffs:
        peers = ", ".join(f"{label} {c[f'cliff_{peer}']:.3f}" for peer, label in PEERS.items()
                          if c.get(f"cliff_{peer}") is not None)
        metric = f"sweep cliff t(L={c['above']})/t(L={c['at']}), kgen {default_tail}" + (f" ({peers})" if peers else "")
        out.append(summary_row("attention sweep", metric, c.get(f"cliff_{default_tail}"), "x"))
    return out


def boundary_summary_row(b: dict[str, Any]) -> dict[str, Any]:
    metric = f"sweep {b['policy']}: t(L={b['below']})/t(L={b['at']}) paired"
    if b.get("ratio") is not None:
        metric += f" ({b['ms_below']:.4f} vs {b['ms_at']:.4f} ms)"
    if b.get("error"):
        metric += f": {b['error']}"
    return summary_row("attention sweep", metric[:300], b.get("ratio"), "x", f"<= {BOUNDARY_BAR}", b["verdict"])


def summary_rows(sweep: list[dict[str, Any]], bounds: list[dict[str, Any]], policies: list[str]
                 ) -> list[dict[str, Any]]:
    """Per L: the tail bar for every policy and kgen against each peer; then the cliff, then the boundary bar."""
    rows = []
    measured = with_tail_verdicts(sweep, policies)
    for r in measured:
        if "error" in r:
            rows.append(summary_row("attention sweep", f"sweep L={r['L']}: crashed: {r['error']}"[:300], None, "",
                                    "", "ERROR"))
            continue
        rows += tail_summary_rows(r, policies) + peer_summary_rows(r)
    default_tail = next((r["default_tail"] for r in measured if "error" not in r), None)
    if default_tail is not None:
        rows += cliff_summary_rows(cliff_rows(sweep, policies), default_tail)
    rows += [boundary_summary_row(b) for b in with_boundary_verdicts(bounds)]
    return rows


# ---- files --------------------------------------------------------------------------------------------

def notes_for(options: argparse.Namespace, policies: list[str]) -> list[str]:
    return [
        f"N = min(4096, 131072 // L) causal sequences of length L (q and k lengths equal), 12 heads, D = 128, bf16. "
        f"kgen runs each tail policy the spec offers at hd128 bf16 ({policies}), forced with "
        f"plan_attention_varlen(tail=...); 'default' marks the one the planner picks unasked. Peers on the same "
        f"sequences in the same run: {PEERS['varlen']} (torch.nn.attention.varlen.varlen_attn, window_size=(-1, 0)) "
        f"on the same packed tensors, and {PEERS['cudnn']} (SDPA under sdpa_kernel(CUDNN_ATTENTION), contiguous "
        f"copies, is_causal=True). t(kgen)/t(peer) is a time ratio with kgen's default tail: > 1 means kgen is slower.",
        f"Timer: calls shorter than 50 us (probed back to back) are CUDA graph replays rotating over enough input sets "
        f"to exceed 3x L2 ('graph'), the rest the event timer with L2 flushed ('events'); every implementation at an "
        f"L uses the same timer, {options.attn_rounds} interleaved rounds, times are their mean and 'spread %' the "
        f"largest difference between rounds. Correctness: kgen's output NaN-poisoned first, first and last sequence "
        f"vs float64; each peer's whole output vs kgen's (status 'differs' over 2e-2).",
        f"Tail bar: t(tail) / t(padded) <= {TAIL_BAR} at every L for every policy, where 'padded' is the same N "
        f"sequences each padded up to whole tiles of the height that policy's plan uses (forced with tile_m=), which "
        f"run its has_incomplete_tile=false twin. Cliff (reported, no bar): t(2^k + 1) / t(2^k). Boundary bar: "
        f"t(2^k - 1) <= {BOUNDARY_BAR} t(2^k) for k = {BOUNDARY_KS.start}..{BOUNDARY_KS.stop - 1}, from a second, "
        f"paired measurement: the two lengths timed alternately (ABBA, event timer, {options.attn_boundary_rounds} "
        f"rounds of {options.attn_boundary_rep_ms:g} ms) on fresh inputs; the ratio is the median of the per-round "
        f"ratios (min and max shown). Bars are observations, never gates.",
    ]


def save_plot(path: Path, sweep: list[dict[str, Any]], policies: list[str]) -> str:
    """Latency vs L, log-log: one line per policy, per padded baseline and per peer; returns a note."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as exc:
        return f"Plot skipped: matplotlib is not importable here ({type(exc).__name__}: {exc})."
    fig, ax = plt.subplots(figsize=(9, 5.5))
    series = ([(f"ms_{p}", f"kgen, tail={p}", "o-") for p in policies]
              + [(f"padded_ms_{p}", f"kgen, padded to whole {p} tiles", "s--") for p in policies]
              + [(f"ms_{peer}", label, "^:") for peer, label in PEERS.items()])
    plotted = 0
    for key, label, style in series:
        points = [(r["L"], r[key]) for r in sweep if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), style, label=label, markersize=4)
            plotted += 1
    if not plotted:
        plt.close(fig)
        return "Plot skipped: no length was measured."
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (N = min(4096, 131072 // L) causal sequences, 12 heads, D = 128, bf16)")
    ax.set_ylabel("latency per call (ms)")
    ax.set_title("attention over N sequences of length L: kgen and its peers")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"Plot: {path.name} (latency vs L, log-log)."


def write_outputs(out_dir: Path, sweep: list[dict[str, Any]], bounds: list[dict[str, Any]], policies: list[str],
                  env: dict[str, Any], options: argparse.Namespace) -> Path:
    """NAME.json (every field) and NAME.md (latency, tail bar, cliff and boundary tables); the plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = notes_for(options, policies)
    try:
        notes.append(save_plot(out_dir / f"{NAME}.png", sweep, policies))
    except Exception as exc:  # a broken plot must not lose the numbers
        notes.append(f"Plot failed: {type(exc).__name__}: {exc}.")
    tails, cliffs, paired = with_tail_verdicts(sweep, policies), cliff_rows(sweep, policies), with_boundary_verdicts(bounds)
    extra = {"tail_policies": policies, "peers": PEERS, "cliff": cliffs, "sweep_boundary": paired}
    _, md_path = write_results(out_dir, NAME, "kgen attention_varlen: seed sweep over L, with peers", tails,
                               latency_columns(policies), env, notes, extra)
    # write_results renders one table; the other three go before the environment section.
    more = (f"## Tail bar: t(tail)/t(padded) <= {TAIL_BAR}\n\n{markdown_table(tails, tail_columns(policies))}\n"
            f"## Cliff: t(2^k+1)/t(2^k)\n\n{markdown_table(cliffs, cliff_columns(policies))}\n"
            f"## Boundary bar: t(2^k-1)/t(2^k) <= {BOUNDARY_BAR}, paired\n\n"
            f"{markdown_table(paired, BOUNDARY_COLUMNS)}\n")
    md_path.write_text(md_path.read_text().replace("\n## Environment\n", f"\n{more}## Environment\n", 1))
    return md_path
