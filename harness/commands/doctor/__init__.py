"""Preflight: what this machine and each variant's environment must provide before a run.

A run is slow to fail: a venv without the engine plugin, a disk that fills during
``make setup`` or an AMX CPU whose tile permission nobody requested shows up minutes
into a launch, as a server log to read. Every check here costs well under a second,
names what it found and how to fix it, so ``offload-check doctor`` is the first thing a
user runs, and :func:`host.host_record` puts the same host facts into every ``run.json`` so a
result can be explained later.

Each check is a function of its inputs (CPU flags, a meminfo text, a disk-usage
function, a probe, a subprocess runner) so the tests can feed it hosts this machine is
not: AMX and non-AMX CPUs, full disks, broken environments.
"""
