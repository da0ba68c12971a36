"""What the engine said about itself in a server log: kernels chosen, AMX permission.

The engine-side half (``harness.engine.specs``, ``harness.engine.amx``) prints one
prefixed line per fact from inside every vLLM process; this reads them back so each
server's results say which code ran, since the same scenario runs different kernels
on different CPUs (and a result without that is not reproducible on another host).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from harness.names import LOG_AMX as AMX_PREFIX
from harness.names import LOG_KERNEL as KERNEL_PREFIX

_KV = re.compile(r"(\w+)=(\S+)")


def kernels(lines: Iterable[str]) -> dict[str, str]:
    """``{"attention_backend": "CPUAttentionBackend", "attention_isa": "vec"}``; several
    distinct values of one key (say, two attention backends) are joined with ``+``."""
    seen: dict[str, list[str]] = {}
    for line in lines:
        if KERNEL_PREFIX not in line:
            continue
        m = _KV.match(line.split(KERNEL_PREFIX, 1)[1].strip())
        if m and m[2] not in seen.setdefault(m[1], []):
            seen[m[1]].append(m[2])
    return {k: "+".join(v) for k, v in seen.items()}


def amx_permission(lines: Iterable[str]) -> str:
    """The AMX state the processes reported: ``requested``, ``off``, or ``not-needed``
    when no process printed one (a CPU without AMX); mixed states are joined."""
    states: list[str] = []
    for line in lines:
        if AMX_PREFIX not in line:
            continue
        words = line.split(AMX_PREFIX, 1)[1].split()
        if words and words[0] not in states:
            states.append(words[0])
    return "+".join(states) or "not-needed"


def describe(lines: Iterable[str]) -> str:
    """One short cell for tables: ``CPUAttentionBackend/vec``, ``CPUMLABackend``."""
    k = kernels(lines)
    return "/".join(v for v in (k.get("attention_backend"), k.get("attention_isa")) if v)
