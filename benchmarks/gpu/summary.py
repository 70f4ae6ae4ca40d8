"""The summary tables of a GPU benchmark report, printed to stdout at the end of a run."""

from __future__ import annotations

import contextlib
from typing import Any

from tram.bench.cpuinfo import cpu_summary


def fmt_goal(ok: bool | None) -> str:
    return "-" if ok is None else ("ok" if ok else "MISS")


def print_decode(res: dict[str, Any]) -> None:
    copy, engine = res.get("copy", {}), res.get("engine", {})
    print(
        f"copy bandwidth {copy.get('bandwidth_GBps', float('nan')):.0f} GB/s; "
        f"attention backend {engine.get('attention_backend')}"
    )
    print(f"{'batch':>5} {'context':>7} {'step ms':>8} {'bound ms':>8} {'ratio':>6} {'tok/s':>9} {'goal<=1.3':>9}")
    for r in res.get("rows", []):
        print(
            f"{r['batch']:>5} {r['context']:>7} {r['step_ms']:>8.2f} {r['bound_ms']:>8.2f} {r['ratio']:>6.2f} "
            f"{r['output_tok_per_s']:>9.0f} {fmt_goal(r['meets_goal']):>9}"
        )
    for r in res.get("rows", []):
        prof = r.get("profile")
        if prof and "error" in prof:
            print(f"profile, batch {r['batch']}: failed ({prof['error']})")
        elif prof:
            print(
                f"profile, batch {r['batch']}: {prof['wall_ms_per_step']:.2f} ms a step, device busy "
                f"{prof['device_busy_ms_per_step']:.2f} ms; most time:"
            )
            for k in prof["top"][:8]:
                print(f"  {k['ms_per_step']:8.3f} ms  x{k['calls_per_step']:<5.0f} {k['name'][:90]}")


def print_throughput(res: dict[str, Any]) -> None:
    w = res.get("workload", {})
    print(f"{w.get('requests')} requests x {w.get('input_len')} in / {w.get('output_len')} out")
    print(f"{'engine':<13} {'requests':>8} {'out tok/s':>10} {'total tok/s':>11} {'seconds':>8} {'setup s':>8}")
    for name in ("tram", "hf"):
        r = res.get(name)
        if not r or "output_tok_per_s" not in r:
            print(f"{name:<13} {r.get('skipped', '-') if r else '-'}")
            continue
        total = r.get("total_tok_per_s", (r["output_tokens"] + r["requests"] * w.get("input_len", 0)) / r["seconds"])
        note = " (timed out: finished requests only)" if r.get("timed_out") else ""
        print(
            f"{name:<13} {r['requests']:>8} {r['output_tok_per_s']:>10.0f} {total:>11.0f} {r['seconds']:>8.1f} "
            f"{r.get('setup_seconds', float('nan')):>8.1f}{note}"
        )
    if "ratio_tram_over_hf" in res:
        print(
            f"Tram / transformers: {res['ratio_tram_over_hf']:.2f}x ({fmt_goal(res['ratio_meets_goal'])}, goal >= 3x)"
        )
    if "tram" in res:
        print(f"Tram output tok/s goal >= 12,500: {fmt_goal(res['tram'].get('meets_goal'))}")
    floor, mm = res.get("compute_floor"), res.get("matmul", {})
    if floor:
        print(
            f"compute floor {floor['seconds']:.1f} s at {mm.get('matmul_TFLOPs', 0):.0f} TFLOP/s (matmul "
            f"n={mm.get('matmul_n')}): at most {floor['max_output_tok_per_s']:.0f} output tok/s"
        )


def print_kernels(res: dict[str, Any]) -> None:
    print(f"shape {res.get('shape')}; all outputs correct: {res.get('all_correct')}")
    print(f"{'write_kv_cache tokens':>21} {'tram ms':>8} {'torch ms':>9} {'speedup':>8} {'correct':>8}")
    for r in res.get("write_kv_cache", []):
        print(
            f"{r['num_tokens']:>21} {r['tram_ms']:>8.4f} {r['torch_index_copy_ms']:>9.4f} "
            f"{r['speedup_vs_torch']:>8.2f} {str(r['correct']):>8}"
        )
    print(
        f"{'case':<18} {'B':>4} {'q':>5} {'ctx':>5} {'split':>5} {'tram ms':>8} {'sdpa ms':>8} {'sdpa':>14} "
        f"{'speedup':>7} {'rel err':>8} {'GB/s':>6} {'%copy':>6} {'check':>5}"
    )
    for r in res.get("decode", []) + res.get("prefill", []):
        print(
            f"{r['case']:<18} {r['batch']:>4} {r['query_len']:>5} {r['context']:>5} {r['num_splits']:>5} "
            f"{r['tram_ms']:>8.4f} {r['sdpa_ms']:>8.4f} {r['sdpa_best']:>14} {r['speedup_vs_sdpa']:>7.2f} "
            f"{r['rel_err']:>8.1e} {r['tram_GBps']:>6.0f} {100 * r['fraction_of_copy_bw']:>5.0f}% "
            f"{'ok' if r['correct'] else 'WRONG':>5}"
        )


def quant_cells(entry: dict[str, Any] | None) -> str:
    """ms, speedup over F.linear, GB/s, % of copy bandwidth, error and check of one quantized GEMM."""
    if entry is None:  # no int4 group divides K
        return f"{'-':>8} {'':>5} {'':>5} {'':>5} {'':>7} {'':>5}"
    return (
        f"{entry['ms']:>8.4f} {entry['speedup_vs_float']:>5.2f} {entry['GBps']:>5.0f} "
        f"{100 * entry['fraction_of_copy_bw']:>4.0f}% {entry['rel_err']:>7.1e} "
        f"{'ok' if entry['correct'] else 'WRONG':>5}"
    )


def print_quant(res: dict[str, Any]) -> None:
    setup, copy = res.get("setup", {}), res.get("copy", {})
    print(
        f"{setup.get('dtype')} x, copy bandwidth {copy.get('bandwidth_GBps', float('nan')):.0f} GB/s, "
        f"TRITON_INTERPRET={setup.get('triton_interpret')}; all outputs correct: {res.get('all_correct')}"
    )
    cells = f"{'ms':>8} {'vs F':>5} {'GB/s':>5} {'%copy':>5} {'rel err':>7} {'check':>5}"  # 40 wide
    print(f"{'':<35} {'F.linear':<14} | {'Triton int8':<40} | Triton int4")
    print(f"{'shape':<18} {'N':>5} {'K':>5} {'rows':>4} {'ms':>8} {'GB/s':>5} | {cells} | {cells}")
    for r in res.get("rows", []):
        f = r["float"]
        print(
            f"{r['shape']:<18} {r['N']:>5} {r['K']:>5} {r['rows']:>4} {f['ms']:>8.4f} {f['GBps']:>5.0f} | "
            f"{quant_cells(r.get('int8'))} | {quant_cells(r.get('int4'))}"
        )
    for t in res.get("layer", []):  # the preset's shapes only
        print(
            f"one decoder layer's linears, {t['rows']} rows: F.linear {t['float_ms']:.4f} ms"
            + "".join(
                f", {k} {t[k + '_ms']:.4f} ms ({t[k + '_speedup_vs_float']:.2f}x)"
                for k in ("int8", "int4")
                if k + "_ms" in t
            )
        )


PRINTERS = {"decode": print_decode, "throughput": print_throughput, "kernels": print_kernels, "quant": print_quant}


def print_report(report: dict[str, Any]) -> None:
    meta = report["meta"]
    dev = meta.get("device") or {}
    print(
        f"\n# gpu_bench {meta['date']} on {dev.get('name')} | "
        + ", ".join(f"{k} {v}" for k, v in meta["versions"].items())
    )
    cpu = (meta.get("machine") or {}).get("cpu")
    if cpu:
        print(f"host CPU: {cpu_summary(cpu)}")
    for name, entry in report["sections"].items():
        print(f"\n== {name}: {entry['status']} ({entry.get('seconds', 0):.0f} s) ==")
        with contextlib.suppress(Exception):  # a partial result may lack fields; show what there is
            PRINTERS[name](entry.get("results", {}))
        if entry["status"] != "ok":
            print(f"ERROR: {entry.get('error')}")
