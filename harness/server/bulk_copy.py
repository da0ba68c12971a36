"""The copy limit of one machine: a bulk copy of a round trip's bytes, each way, timed.

Why: vLLM's offload counters say how many bytes its worker moved and for how long, which
alone says nothing about whether that is fast. The plainest copy of the same bytes on the
same machine, in the same run, is the yardstick (issue #43: on an H200 one pinned copy of
the seed's 245 MB took 4.5 ms, the same bytes as 7,488 block-sized copies 103 ms).

Run as a script, by its path, in the variant's interpreter (``harness.server.copy_limit``
starts it once the round trip's servers have stopped, so nothing competes for the device),
so it imports nothing of the harness: that interpreter need not hold it. On CUDA: one
pinned host buffer and one device buffer, copied device -> host (a store's direction) and
host -> device (a load's), timed with CUDA events as vLLM's own offload worker times its
transfers (``vllm/v1/kv_offload/cpu/gpu_worker.py``); on the CPU platform, where the
engine's "GPU" KV cache is host memory, a host-to-host copy each way, timed on the clock.
The best of ``--repeat`` after one warm-up (first touch faults the pages in; the first CUDA
copy sets the context up). Each direction copies its own byte pattern and the destination
is checked after the timing, so a short or failed copy cannot pass for a fast one.

Prints one line, ``OFFLOAD_CHECK_COPY {json}``; exits 2 with one line on bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable

import torch

TAG = "OFFLOAD_CHECK_COPY"
STORE_BYTE, LOAD_BYTE = 0x5A, 0xA5  # each direction's pattern


def timed(copy: Callable[[], float], repeat: int) -> list[float]:
    """``copy`` once to warm up, then ``repeat`` timed runs (each returns its seconds)."""
    copy()
    return [copy() for _ in range(repeat)]


def verify(dst: torch.Tensor, pattern: int, what: str) -> None:
    """Every byte of ``dst`` is ``pattern``: the copy moved all of it."""
    wrong = int((dst != pattern).sum().item())
    if wrong:
        raise RuntimeError(f"{what}: {wrong:,} of {dst.numel():,} bytes not copied")


def measure_cuda(nbytes: int, repeat: int) -> dict[str, object]:
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)

    def one(dst: torch.Tensor, src: torch.Tensor) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src, non_blocking=True)
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end)) / 1e3  # elapsed_time is in ms

    dev.fill_(STORE_BYTE)
    host.zero_()
    store = timed(lambda: one(host, dev), repeat)
    verify(host, STORE_BYTE, "device -> pinned host")
    host.fill_(LOAD_BYTE)
    dev.zero_()
    load = timed(lambda: one(dev, host), repeat)
    verify(dev, LOAD_BYTE, "pinned host -> device")
    name = torch.cuda.get_device_name(0)
    return {
        "device": "cuda",
        "how": f"one pinned host <-> {name} copy (CUDA events)",
        "store": store,
        "load": load,
    }


def measure_cpu(nbytes: int, repeat: int) -> dict[str, object]:
    engine = torch.empty(nbytes, dtype=torch.uint8)
    tier = torch.empty(nbytes, dtype=torch.uint8)

    def one(dst: torch.Tensor, src: torch.Tensor) -> float:
        t0 = time.perf_counter()
        dst.copy_(src)
        return time.perf_counter() - t0

    engine.fill_(STORE_BYTE)
    tier.zero_()
    store = timed(lambda: one(tier, engine), repeat)
    verify(tier, STORE_BYTE, "engine -> tier")
    engine.zero_()
    tier.fill_(LOAD_BYTE)
    load = timed(lambda: one(engine, tier), repeat)
    verify(engine, LOAD_BYTE, "tier -> engine")
    return {
        "device": "cpu",
        "how": f"one host-to-host copy ({torch.get_num_threads()} torch threads)",
        "store": store,
        "load": load,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bulk_copy", description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--device", choices=("cpu", "cuda"), required=True)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args(argv)
    if args.bytes <= 0 or args.repeat <= 0:
        print("bulk_copy: --bytes and --repeat must be positive", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("bulk_copy: CUDA is not available to this interpreter", file=sys.stderr)
        return 2
    measure = measure_cuda if args.device == "cuda" else measure_cpu
    out = {**measure(args.bytes, args.repeat), "bytes": args.bytes, "torch": torch.__version__}
    print(f"{TAG} {json.dumps(out)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
