"""A worker process: one rank, started by the multiprocessing executor as
`python -m tram.executor.worker_proc` with its WorkerArgs pickled on stdin.

It loads its shard, says READY, then runs what the engine sends, in order: a step (rank 0 answers
with the output), an RPC (every rank answers) or SHUTDOWN. Any failure is reported as ERROR and
ends the process; the engine then fails the requests in flight. A watchdog thread ends the process
when the engine's process is gone, even in the middle of a collective that would never return.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from typing import Any

from tram.config import EngineConfig

PARENT_POLL_S = 0.5


@dataclass
class WorkerArgs:
    config: EngineConfig
    rank: int
    world_size: int
    init_method: str  # torch.distributed rendezvous (tcp://host:port)
    input_addr: str  # this rank's ZMQ PULL address
    reply_addr: str  # the engine's ZMQ PULL address
    parent_pid: int
    threads: int  # CPU threads of this rank's model


def _watch_parent(parent_pid: int) -> None:
    while True:
        time.sleep(PARENT_POLL_S)
        if os.getppid() != parent_pid:
            os._exit(1)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(0)


def main() -> None:
    args: WorkerArgs = pickle.load(sys.stdin.buffer)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group; the engine decides
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    threading.Thread(target=_watch_parent, args=(args.parent_pid,), name="tram-parent-watch", daemon=True).start()
    import torch
    import zmq

    from tram.executor import messages as m

    if args.config.model_config.device_type == "cpu":
        torch.set_num_threads(args.threads)
    # Every rank draws the same random numbers, so unseeded sampling picks the same tokens everywhere.
    torch.manual_seed(args.config.model_config.seed)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.connect(args.input_addr)
    out = ctx.socket(zmq.PUSH)
    out.setsockopt(zmq.LINGER, 2000)
    out.connect(args.reply_addr)
    try:
        _serve(args, inbox, out, m)
    except SystemExit:
        pass
    except BaseException as e:  # noqa: BLE001 - tell the engine why this rank is going away
        out.send_multipart(m.reply(m.ERROR, args.rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        out.close()
        ctx.term()
        sys.exit(1)
    out.close()
    inbox.close(linger=0)
    ctx.term()


def _serve(args: WorkerArgs, inbox: Any, out: Any, m: Any) -> None:
    from tram.worker.worker import Worker

    worker = Worker(args.config, args.rank, args.world_size, args.init_method)
    out.send_multipart(m.reply(m.READY, args.rank))
    while True:
        frames = inbox.recv_multipart(copy=False)
        kind = frames[0].bytes
        if kind == m.EXECUTE:
            output = worker.execute_model(m.decode_sched(frames[1].buffer))
            if args.rank == args.config.parallel_config.output_rank:
                out.send_multipart(m.encode_output(args.rank, output), copy=False)
        elif kind == m.RPC:
            method, call_args = pickle.loads(frames[1].buffer)
            out.send_multipart(m.reply(m.RESULT, args.rank, getattr(worker, method)(*call_args)))
        elif kind == m.SHUTDOWN:
            return


if __name__ == "__main__":
    main()
    # Leave without Python's teardown: nothing a rank holds needs it (its sockets are closed, the
    # shared-memory file unlinked when it was mapped), and tearing down torch's modules costs half a
    # second of every engine shutdown. Output is flushed first. A failing rank exits through sys.exit.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
