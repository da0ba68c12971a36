"""Keep Python's fault handler in charge of fatal signals in vLLM processes.

The launcher runs servers with ``PYTHONFAULTHANDLER=1`` so that a process killed by
SIGSEGV/SIGILL/SIGBUS/SIGFPE/SIGABRT leaves its Python stack in the log, where the
harness reads the dying frame. But vLLM's dependencies load native libraries that
install their own SIGSEGV handler over it (``tvm_ffi``, imported by xgrammar, prints
only C frames): a worker then dies with no Python stack and the harness can say no
more than "died unexpectedly". Loading such a library first and then re-arming the
fault handler puts Python's handler on top; it still chains to the native one, so
the C backtrace is printed too.

Loaded in vLLM processes: standard library only.
"""

from __future__ import annotations

import faulthandler
import importlib
import importlib.util
import os

# Native libraries known to replace the SIGSEGV handler when they load.
_HANDLER_STEALERS = ("tvm_ffi",)


def rearm() -> bool:
    """Re-install Python's fault handler over native ones; False when not asked for."""
    if not os.environ.get("PYTHONFAULTHANDLER"):
        return False
    for name in _HANDLER_STEALERS:
        try:
            if importlib.util.find_spec(name) is not None:
                importlib.import_module(name)
        except Exception:  # a broken optional library must not stop the engine
            continue
    faulthandler.disable()
    faulthandler.enable(all_threads=True)
    return True
