"""The shared-memory collectives against the sums and concatenations they must equal: every rank
gets bitwise the same result, back-to-back collectives reuse the two banks safely, tensors larger
than a slot fall back to gloo, and nothing is left in /dev/shm."""

from __future__ import annotations

import glob
import multiprocessing
import os
import traceback

import pytest
import torch


def _rank_main(rank: int, size: int, port: int, slot_bytes: int, results: multiprocessing.Queue) -> None:
    try:
        import torch.distributed as dist

        from tram.distributed import communication, parallel_state
        from tram.distributed.shm_comm import ShmCommunicator

        torch.set_num_threads(1)
        tp = parallel_state.init_tensor_parallel(rank, size, f"tcp://127.0.0.1:{port}", "cpu")
        assert tp.backend == "shm"
        # A second communicator with small slots, to see the fallback to gloo past a slot.
        path = [ShmCommunicator.create_file(size, slot_bytes) if rank == 0 else None]
        dist.broadcast_object_list(path, src=0)
        small = ShmCommunicator(path[0], rank, size, slot_bytes)
        dist.barrier()
        if rank == 0:
            os.unlink(path[0])
        parallel_state.set_tp(parallel_state.TensorParallel(rank, size, tp.group, "shm", small))
        out = []
        for step in range(40):  # many in a row: banks are reused every other collective
            gen = torch.Generator().manual_seed(1000 * step + rank)
            dtype = (torch.float32, torch.bfloat16)[step % 2]
            rows = 1 + step % 7 if step < 30 else 400  # the last ones exceed the small slots
            x = torch.randn(rows, 96, generator=gen).to(dtype)
            reduced = communication.tp_all_reduce(x.clone())
            gathered = communication.tp_all_gather(x)
            # As float32 arrays (exact for bfloat16): tensors in a queue would travel as shared memory
            # that goes away with this process.
            out.append(tuple((t.float().numpy(), str(t.dtype)) for t in (x, reduced, gathered)))
        results.put((rank, out, None))
        small.close()
        tp.shm.close()
        parallel_state.destroy_tensor_parallel()
    except BaseException:  # noqa: BLE001 - report to the test
        results.put((rank, None, traceback.format_exc()))


def _tensor(item: tuple) -> torch.Tensor:
    array, dtype = item
    return torch.from_numpy(array).to(getattr(torch, dtype.removeprefix("torch.")))


@pytest.mark.parametrize("size", [2, 3])
def test_shm_collectives_match_the_definitions(size: int):
    from tram.executor.multiproc import free_port

    before = set(glob.glob("/dev/shm/tram-tp-*"))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    slot_bytes = 8 * 96 * 4  # 8 float32 rows
    port = free_port()
    procs = [ctx.Process(target=_rank_main, args=(r, size, port, slot_bytes, results)) for r in range(size)]
    for p in procs:
        p.start()
    got = {}
    for _ in range(size):
        rank, out, error = results.get(timeout=120)
        assert error is None, error
        got[rank] = out
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    got = {r: [tuple(_tensor(a) for a in step) for step in out] for r, out in got.items()}
    for step in range(40):
        inputs = [got[r][step][0] for r in range(size)]
        expected_sum = inputs[0] + inputs[1]
        for extra in inputs[2:]:
            expected_sum = expected_sum + extra
        expected_cat = torch.cat(inputs, dim=-1)
        for r in range(size):
            _, reduced, gathered = got[r][step]
            if step < 30:  # through shared memory: exactly the rank-order sum, on every rank
                assert torch.equal(reduced, expected_sum), (step, r)
            else:  # through gloo
                torch.testing.assert_close(reduced.float(), expected_sum.float(), rtol=2e-2, atol=2e-2)
            assert torch.equal(reduced, got[0][step][1])  # every rank holds the same bits
            assert torch.equal(gathered, expected_cat)
    assert set(glob.glob("/dev/shm/tram-tp-*")) == before  # nothing left behind
