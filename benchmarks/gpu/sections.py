"""Running the sections, each in a child process by default, and the JSON report they fill.

A section in its own process loses only itself to a crash, a CUDA error or a timeout (its results
saved so far are kept), and starts with a clean GPU. Results go to --out after every section.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tram.bench.report import device_info, git_revision, machine_info, versions, write_json

from gpu.common import GOALS, Ctx, free_memory, log, resolve_bench_device  # isort: skip
from gpu.decode import run_decode  # isort: skip
from gpu.kernels import run_kernels  # isort: skip
from gpu.quant import run_quant  # isort: skip
from gpu.throughput import run_throughput  # isort: skip

SECTIONS: dict[str, Callable[[Ctx, dict[str, Any]], None]] = {
    "decode": run_decode,
    "kernels": run_kernels,
    "quant": run_quant,
    "throughput": run_throughput,
}
# The default set and its order: the cheap kernel sections before throughput, whose transformers
# run is the longest and likeliest to be cut off.
SECTION_NAMES = ("decode", "kernels", "quant", "throughput")
ENTRY = Path(__file__).resolve().parent.parent / "gpu_bench.py"  # what a child runs


def run_section(name: str, args: argparse.Namespace, save_entry: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Run one section in this process; an exception becomes the entry's error, partial results stay."""
    entry: dict[str, Any] = {"status": "running", "results": {}}
    device: torch.device | None = None
    start = time.perf_counter()
    try:
        device = resolve_bench_device(args.device)
        entry["device"] = device_info(device)
        torch.manual_seed(args.seed)
        ctx = Ctx(args, device, getattr(torch, args.dtype), save=lambda: save_entry(entry))
        SECTIONS[name](ctx, entry["results"])
        entry["status"] = "ok"
    except Exception as err:  # report and carry on with the other sections
        entry["status"] = "error"
        entry["error"] = f"{type(err).__name__}: {err}"
        entry["traceback"] = traceback.format_exc()
        log(f"{name}: FAILED\n{entry['traceback']}")
    entry["seconds"] = time.perf_counter() - start
    if device is not None:
        with contextlib.suppress(Exception):  # after a CUDA error even this can fail
            free_memory(device)
    save_entry(entry)
    return entry


def run_section_in_child(name: str, timeout: float) -> dict[str, Any]:
    """The same command line in a child process that runs only `name` and writes its entry to a file."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu-bench-") as tmp:
        path = Path(tmp) / f"{name}.json"
        cmd = [
            sys.executable,
            str(ENTRY),
            *sys.argv[1:],
            "--child-section",
            name,
            "--child-out",
            str(path),
            "--child-deadline",
            str(time.time() + timeout),
        ]
        proc = subprocess.Popen(cmd, start_new_session=True)  # own group: a timeout kills its helpers too
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
        entry = json.loads(path.read_text()) if path.exists() else {"status": "error", "results": {}}
    entry["wall_seconds"] = time.perf_counter() - start  # with the child's imports and start-up
    entry.setdefault("seconds", entry["wall_seconds"])  # a killed child never wrote its own
    if code is None:
        entry.update(status="error", error=f"timed out after {timeout:.0f} s (results saved so far kept)")
    elif code != 0 and entry.get("status") != "error":
        entry.update(status="error", error=f"child process exited with code {code}")
    return entry


def new_report(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "meta": {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "argv": sys.argv[1:],
            "args": vars(args),
            "smoke": args.smoke,
            "versions": versions(),
            "platform": platform.platform(),
            "git": git_revision(),
            "machine": machine_info(),
            "device": None,
        },
        "goals": GOALS,
        "sections": {},
    }


def run_child(args: argparse.Namespace) -> None:
    """A child: run one section; its entry goes to --child-out after every saved step."""
    run_section(args.child_section, args, lambda entry: write_json(args.child_out, entry))


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    """Every section of --sections in turn (in children unless --no-isolate); --out after each."""
    report = new_report(args)
    for name in args.sections:
        log(f"section {name}: start")
        if args.no_isolate:
            entry = run_section(name, args, lambda e: None)
        else:
            entry = run_section_in_child(name, args.timeouts.get(name, 600.0))
        report["sections"][name] = entry
        report["meta"]["device"] = report["meta"]["device"] or entry.get("device")
        log(f"section {name}: {entry['status']} in {entry.get('seconds', 0):.0f} s")
        write_json(args.out, report)
    return report
