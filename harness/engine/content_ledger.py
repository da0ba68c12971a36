"""The content ledger: what every KV chunk held when it was stored and when it was loaded.

Byte counters say how much moved; they cannot say *what* moved. A chunk file holding
its neighbour's bytes, a copy that reads the slot next to the one it was asked for, a
tier that serves a stale chunk: every count stays exact and only the answers may show
it, if the prompts differ enough. With ``OFFLOAD_CHECK_LEDGER=<dir>`` the harness's host
backend writes, in each vLLM process, one JSON line per event to
``<dir>/<role>-<pid>.jsonl``:

- ``assign`` (scheduler process, the offloading manager): the offload keys a store or a
  load was prepared for and the CPU slots (chunk rows) they map to, in the same order;
- ``store`` / ``load`` (each worker rank): per KV-cache group, slot row and block within
  the chunk, a digest of every layer tensor's bytes of the engine's block: for a store
  the KV the job was to copy out, for a load the KV the engine holds once it ran. Both
  are read on the engine's side (on a GPU: on the device, nothing copied back), so a
  store that copied nothing, or the wrong bytes, shows at the load that reads it.

Every line carries ``t`` (``time.monotonic_ns``, one clock for every process of a host)
so the harness can tell which key a slot held at each copy
(``harness.results.content`` judges it). A slot's key cannot change between the
manager's assignment and the copy: the chunk is write-pending or pinned until the
worker reports the job done.

The digest is a 64-bit weighted sum of the block's bytes read as int64 words (fixed
weights, wrapping): one pass over the bytes the copy just touched, no copy back from a
GPU, and it tells any two different blocks apart but for a 2^-64 chance.

Only the standard library and torch are imported here: vLLM loads it in its processes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import torch

from harness.names import ENV_LEDGER

_WEIGHTS: dict[tuple[int, str], torch.Tensor] = {}
_LOCK = threading.Lock()


def _weights(n: int, device: torch.device) -> torch.Tensor:
    """``n`` fixed odd int64 weights (the same in every process and on every run)."""
    key = (n, str(device))
    w = _WEIGHTS.get(key)
    if w is None:
        gen = torch.Generator().manual_seed(0x0FF10AD)
        w = torch.randint(-(2**62), 2**62, (n,), generator=gen, dtype=torch.int64) | 1
        w = w.to(device)
        _WEIGHTS[key] = w
    return w


def digests(blocks: torch.Tensor) -> list[int]:
    """One digest per row of ``blocks`` (any dtype, one block per row)."""
    rows = blocks.reshape(blocks.shape[0], -1).contiguous().view(torch.int8)
    n = rows.shape[1]
    # A page that is not whole words: each byte its own word.
    words = rows.view(torch.int64) if n % 8 == 0 else rows.to(torch.int64)
    w = _weights(words.shape[1], words.device)
    return [int(d) for d in (words * w).sum(dim=1).tolist()]


class Ledger:
    """One process's ledger file, line-buffered so a killed engine keeps what it wrote."""

    def __init__(self, directory: str | os.PathLike[str], role: str) -> None:
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        self.path = path / f"{role}-{os.getpid()}.jsonl"
        self._fh = self.path.open("a", encoding="utf-8", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        line = json.dumps({"t": time.monotonic_ns(), **record}, separators=(",", ":"))
        with _LOCK:  # the fs tier's threads and the engine's may both write
            self._fh.write(line + "\n")

    def close(self) -> None:
        self._fh.close()


def open_ledger(role: str, directory: str | None = None) -> Ledger | None:
    """This process's ledger in ``directory`` (default: ``OFFLOAD_CHECK_LEDGER``, as a
    server's processes get it), or None when the run keeps none."""
    where = (directory if directory is not None else os.environ.get(ENV_LEDGER, "")).strip()
    return Ledger(where, role) if where else None


def key_text(key: Any) -> str:
    """An offload key as text: its bytes in hex (vLLM's keys are bytes)."""
    if isinstance(key, (bytes, bytearray, memoryview)):
        return bytes(key).hex()
    return repr(key)


def record_assignments(manager: Any, ledger: Ledger) -> None:
    """Wrap ``manager``'s ``prepare_store`` and ``prepare_load`` so each writes the keys it
    prepared and the CPU slots they map to (``assign``). Nothing else changes."""
    prepare_store, prepare_load = manager.prepare_store, manager.prepare_load

    def slots_of(spec: Any) -> list[int]:
        ids = getattr(spec, "block_ids", None)
        return [] if ids is None else [int(x) for x in list(ids)]

    def store(keys: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare_store(keys, *args, **kwargs)
        if out is not None and getattr(out, "keys_to_store", None):
            ledger.write(
                {
                    "op": "assign",
                    "for": "store",
                    "keys": [key_text(k) for k in out.keys_to_store],
                    "slots": slots_of(out.store_spec),
                }
            )
        return out

    def load(keys: Any, *args: Any, **kwargs: Any) -> Any:
        keys = list(keys)
        out = prepare_load(keys, *args, **kwargs)
        ledger.write(
            {
                "op": "assign",
                "for": "load",
                "keys": [key_text(k) for k in keys],
                "slots": slots_of(out),
            }
        )
        return out

    manager.prepare_store, manager.prepare_load = store, load
