"""The side-by-side table of a serving comparison (benchmarks/llama_cpp_peer.py, vllm_cpu_peer.py):
one line per engine and concurrency from `tram bench serve` results, then Tram's ratio to the peer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

PeerOf = Callable[[dict, int], "dict | None"]  # (results by (label, concurrency), concurrency) -> peer's result


def print_serve_comparison(runs: list[dict], engines: Sequence[str], peer_of: PeerOf) -> list[dict]:
    """Prints the table; returns the ratio rows (concurrency, peer, throughput_ratio, p99_ttft_ratio)."""
    by = {(r["label"], r["sweep"]["value"]): r for r in runs}
    width = max(len(e) for e in (*engines, "engine"))
    rows = []
    print(
        f"\n{'conc':>5} {'engine':<{width}} {'out tok/s':>10} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9} "
        f"{'failed':>6} {'len mismatch':>12}"
    )
    for conc in sorted({r["sweep"]["value"] for r in runs}):
        for engine in engines:
            r = by.get((engine, conc))
            if r:
                print(
                    f"{conc:>5} {engine:<{width}} {r['output_throughput']:>10.1f} {r['p50_ttft_ms']:>9.1f} "
                    f"{r['p99_ttft_ms']:>9.1f} {r['p50_tpot_ms'] or 0:>9.2f} {r['failed']:>6} "
                    f"{r['output_len_mismatches']:>12}"
                )
        tram, peer = by.get(("tram", conc)), peer_of(by, conc)
        if tram and peer:
            row = {
                "concurrency": conc,
                "peer": peer["label"],
                "throughput_ratio": tram["output_throughput"] / peer["output_throughput"],
                "p99_ttft_ratio": tram["p99_ttft_ms"] / peer["p99_ttft_ms"],
            }
            rows.append(row)
            print(
                f"{conc:>5} {'ratio':<{width}} {row['throughput_ratio']:>9.2f}x {'':>9} "
                f"{row['p99_ttft_ratio']:>8.2f}x  (tram / {peer['label']}; throughput higher is better, TTFT lower)"
            )
    return rows
