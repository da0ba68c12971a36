"""Admin calls to a running server that vLLM may refuse for a while: the prefix-cache
reset (``POST /reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``), retried
while vLLM answers 200 ``{"success": false}`` because requests still hold blocks (a
documented contract, not an error)."""

from __future__ import annotations

import json
import time

from harness.errors import HarnessError
from harness.server.launcher import http_post


def reset_prefix_cache(
    url: str, *, external: bool, timeout_s: float = 60.0, poll_s: float = 0.5
) -> None:
    """Empty the GPU prefix cache, and with ``external`` the offloading tier too (its
    policy's ``clear()`` runs on the way); raises ``HarnessError`` with one line when the
    endpoint is missing or vLLM never agrees within ``timeout_s``."""
    query = "true" if external else "false"
    deadline, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline:
        status, last = http_post(f"{url}/reset_prefix_cache?reset_external={query}", 30.0)
        if status != 200:
            raise HarnessError(
                f"{url}/reset_prefix_cache answered {status} (the server needs "
                "VLLM_SERVER_DEV_MODE=1): {last[:200]}"
            )
        try:
            ok = json.loads(last).get("success", True) if last.strip() else True
        except (ValueError, AttributeError):
            ok = True
        if ok:
            return
        time.sleep(poll_s)
    what = "the prefix cache and the tier were" if external else "the prefix cache was"
    raise HarnessError(f"{what} never reset: {last[:200]}")
