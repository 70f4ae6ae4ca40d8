"""Tensor parallelism on one CPU node: what the collectives cost, what a step's broadcast costs, and
what TP buys against one rank, in one run each.

    python benchmarks/tp_cpu.py collectives            # all-reduce latency, gloo vs shared memory
    python benchmarks/tp_cpu.py broadcast              # one step's scheduler output to every rank
    python benchmarks/tp_cpu.py throughput --model llama-110m --num-prompts 64 [--rounds 2]

`throughput` runs the same requests through each configuration in turn (TP=1 with all threads; TP=2
with one thread per rank and shared-memory collectives; TP=2 over gloo; DP=2, two engines with one
thread each and half the requests each), greedy, and prints output tokens/s and each one's ratio to
TP=1. Every report starts with the machine (CPU model, ISA flags).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import statistics
import time
from typing import Any

import _checkout  # noqa: F401  (this checkout's tram first on sys.path)
import torch

from tram.bench.report import machine_summary

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]


# ---- collectives -------------------------------------------------------------------------------
def _collective_rank(rank: int, size: int, port: int, iters: int, out: Any) -> None:
    import torch.distributed as dist

    from tram.distributed import parallel_state

    torch.set_num_threads(1)
    tp = parallel_state.init_tensor_parallel(rank, size, f"tcp://127.0.0.1:{port}", "cpu")
    rows = []
    for nbytes in SIZES:
        x = torch.randn(nbytes // 4)
        row = {"bytes": nbytes}
        for name, fn in (("gloo", lambda t: dist.all_reduce(t)), ("shm", tp.shm.all_reduce)):
            for _ in range(10):
                fn(x)
            times = []
            for _ in range(iters):
                start = time.perf_counter()
                fn(x)
                times.append(time.perf_counter() - start)
            row[name] = statistics.median(times) * 1e6
        rows.append(row)
    if rank == 0:
        out.put(rows)
    parallel_state.destroy_tensor_parallel()


def collectives(args: argparse.Namespace) -> None:
    from tram.executor.multiproc import free_port

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_collective_rank, args=(r, args.ranks, port, args.iters, out)) for r in range(args.ranks)
    ]
    for p in procs:
        p.start()
    rows = out.get(timeout=600)
    for p in procs:
        p.join()
    print(f"all-reduce of float32, {args.ranks} ranks, one thread each, median of {args.iters}")
    print(f"{'size':>8} {'gloo us':>9} {'shm us':>9} {'gloo/shm':>9}")
    for row in rows:
        print(f"{row['bytes'] // 1024:>6}Ki {row['gloo']:>9.1f} {row['shm']:>9.1f} {row['gloo'] / row['shm']:>9.1f}")


# ---- broadcast ---------------------------------------------------------------------------------
def _echo_rank(addr_in: str, addr_out: str, rank: int) -> None:
    import zmq

    from tram.executor import messages as m

    ctx = zmq.Context()
    inbox, reply = ctx.socket(zmq.PULL), ctx.socket(zmq.PUSH)
    inbox.connect(addr_in)
    reply.connect(addr_out)
    while True:
        frames = inbox.recv_multipart(copy=False)
        if frames[0].bytes == m.SHUTDOWN:
            return
        m.decode_sched(frames[1].buffer)
        if rank == 0:
            reply.send_multipart([b"ok"])


def _decode_step(num_reqs: int) -> Any:
    from tram.core.sched_output import CachedRequestData, SchedulerOutput

    ids = [f"cmpl-{i:032x}-0" for i in range(num_reqs)]
    cached = [CachedRequestData(rid, [[1000 + i] if i % 16 == 0 else []], 300 + i) for i, rid in enumerate(ids)]
    return SchedulerOutput(
        scheduled_cached_reqs=cached, num_scheduled_tokens=dict.fromkeys(ids, 1), total_num_scheduled_tokens=num_reqs
    )


def broadcast(args: argparse.Namespace) -> None:
    import tempfile

    import zmq

    from tram.executor import messages as m

    folder = tempfile.mkdtemp(prefix="tram-bcast-")
    ctx = zmq.Context()
    replies = ctx.socket(zmq.PULL)
    replies.bind(f"ipc://{folder}/out")
    spawn = multiprocessing.get_context("spawn")
    inboxes, procs = [], []
    for rank in range(args.ranks):
        sock = ctx.socket(zmq.PUSH)
        sock.bind(f"ipc://{folder}/in{rank}")
        inboxes.append(sock)
        procs.append(spawn.Process(target=_echo_rank, args=(f"ipc://{folder}/in{rank}", f"ipc://{folder}/out", rank)))
        procs[-1].start()
    print(f"one decode step's scheduler output to {args.ranks} ranks over ZMQ ipc (median of {args.iters})")
    print(f"{'requests':>8} {'bytes':>8} {'encode us':>10} {'round trip us':>14}")
    for num_reqs in (1, 16, 64, 256):
        sched = _decode_step(num_reqs)
        encode, trip = [], []
        for i in range(args.iters + 20):
            start = time.perf_counter()
            frames = m.encode_sched(sched)
            mid = time.perf_counter()
            for sock in inboxes:
                sock.send_multipart(frames, copy=False)
            replies.recv_multipart()
            if i >= 20:
                encode.append(mid - start)
                trip.append(time.perf_counter() - start)
        print(
            f"{num_reqs:>8} {len(frames[1]):>8} {statistics.median(encode) * 1e6:>10.1f} "
            f"{statistics.median(trip) * 1e6:>14.1f}"
        )
    for sock in inboxes:
        sock.send_multipart([m.SHUTDOWN])
    for p in procs:
        p.join()
    ctx.destroy(linger=0)


# ---- throughput --------------------------------------------------------------------------------
CONFIGS = {  # name -> (LLM keywords, environment); dp2 is two engines in two processes
    "tp1": ({}, {"TRAM_TP_SHM": "1"}),
    "tp1-1t": ({}, {}),  # one engine on one thread: what each DP replica is, so dp2 <= 2x this
    "tp2-shm": ({"tensor_parallel_size": 2}, {"TRAM_TP_SHM": "1"}),
    "tp2-gloo": ({"tensor_parallel_size": 2}, {"TRAM_TP_SHM": "0"}),
    "dp2": ({}, {}),
    "pp2": ({"pipeline_parallel_size": 2}, {}),
    "pp2-serial": ({"pipeline_parallel_size": 2}, {}),  # its batch queue cut to one step in flight
}
DEFAULT_CONFIGS = "tp1,tp2-shm,tp2-gloo,dp2"


def _dp_replica(model: str, dtype: str, threads: int, requests: list, barrier: Any, out: Any, index: int) -> None:
    from tram import LLM, SamplingParams

    torch.set_num_threads(threads)
    llm = LLM(model, dtype=dtype, max_num_seqs=256, max_model_len=1024)
    params = [SamplingParams(temperature=0, max_tokens=r.output_len, ignore_eos=True) for r in requests]
    prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in requests]
    llm.generate(prompts[:2], params[:2], use_tqdm=False)  # warm-up
    barrier.wait()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    out.put((index, time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]))


def _run_data_parallel(model: str, args: argparse.Namespace, requests: list, size: int = 2) -> tuple[float, list]:
    """What `--data-parallel-size 2` does, offline: two engines, one thread each, requests dealt out
    in turn (the router's choice when loads are equal); the time is the slower replica's."""
    ctx = multiprocessing.get_context("spawn")
    barrier, out = ctx.Barrier(size), ctx.Queue()
    shares = [requests[i::size] for i in range(size)]
    procs = [
        ctx.Process(
            target=_dp_replica, args=(model, args.dtype, max(1, args.threads // size), shares[i], barrier, out, i)
        )
        for i in range(size)
    ]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=3600) for _ in procs)
    for p in procs:
        p.join()
    print("  dp replicas took " + ", ".join(f"{seconds:.2f} s" for _, seconds, _ in results), flush=True)
    outputs: list = [None] * len(requests)
    for index, _, outs in results:
        outputs[index::size] = outs
    return max(seconds for _, seconds, _ in results), outputs


def _run_config(name: str, model: str, args: argparse.Namespace, requests: list) -> tuple[float, list]:
    from tram import LLM
    from tram.bench.throughput import timed_greedy

    if name == "dp2":
        return _run_data_parallel(model, args, requests)
    kwargs, env = CONFIGS[name]
    os.environ.update(env)
    torch.set_num_threads(1 if name == "tp1-1t" else args.threads)
    llm = LLM(model, dtype=args.dtype, max_num_seqs=256, max_model_len=1024, **kwargs)
    if name == "pp2-serial":
        llm.llm_engine.engine_core.batch_queue_size = 1
    seconds, outputs = timed_greedy(llm, requests)
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    return seconds, outputs


def throughput(args: argparse.Namespace) -> None:
    from tram.bench.datasets import parse_range, random_requests
    from tram.bench.presets import checkpoint_for

    torch.set_num_threads(args.threads)
    model = checkpoint_for(args.model, args.dtype)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(model).vocab_size
    requests = random_requests(args.num_prompts, parse_range(args.input_len), parse_range(args.output_len), vocab)
    tokens = sum(r.output_len for r in requests)
    print(
        f"{args.model} {args.dtype}, {len(requests)} requests ({args.input_len} in, {args.output_len} out), "
        f"{tokens} output tokens; TP=1 with {args.threads} threads, TP=2 with {max(1, args.threads // 2)} per rank"
    )
    best: dict[str, float] = {}
    outputs: dict[str, list] = {}
    for rnd in range(args.rounds):
        for name in args.configs.split(","):
            seconds, outs = _run_config(name, model, args, requests)
            outputs[name] = outs
            rate = sum(map(len, outs)) / seconds
            best[name] = max(best.get(name, 0.0), rate)
            print(f"round {rnd} {name:<9} {seconds:7.2f} s {rate:8.1f} out tok/s", flush=True)
    base = best.get("tp1")
    for name, rate in best.items():
        same = sum(a == b for a, b in zip(outputs[name], outputs.get("tp1", outputs[name])))
        ratio = f"{rate / base:.2f}x tp1" if base else ""
        print(f"best {name:<9} {rate:8.1f} out tok/s  {ratio}  greedy outputs equal to tp1: {same}/{len(requests)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("collectives")
    c.add_argument("--ranks", type=int, default=2)
    c.add_argument("--iters", type=int, default=300)
    b = sub.add_parser("broadcast")
    b.add_argument("--ranks", type=int, default=2)
    b.add_argument("--iters", type=int, default=300)
    t = sub.add_parser("throughput")
    t.add_argument("--model", default="llama-110m")
    t.add_argument("--dtype", default="float32")
    t.add_argument("--num-prompts", type=int, default=64)
    t.add_argument("--input-len", default="32:256")
    t.add_argument("--output-len", default="16:128")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--rounds", type=int, default=1)
    t.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma-separated, of: {', '.join(CONFIGS)}")
    args = p.parse_args()
    print(machine_summary())
    {"collectives": collectives, "broadcast": broadcast, "throughput": throughput}[args.cmd](args)


if __name__ == "__main__":
    main()
