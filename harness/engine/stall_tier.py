"""A secondary tier whose loads never complete, for the ``tier-never-loads`` disk fault.

vLLM loads an out-of-tree secondary tier by class name from a ``module_path`` given in
``secondary_tiers`` (``SecondaryTierFactory.get_tier_class``); this is such a tier, so
the engine's own tiering code (lookup, promotion, the request waiting on it) runs
unchanged against a tier that hangs. It is vLLM's in-memory example tier (every store
kept and acknowledged at once, every lookup of a stored key a hit) except that a load is
taken and never finished: what a stalled NFS mount or a hung object store looks like to
the engine (#54363's liveness gap, #49829's request without a deadline).

Loaded inside vLLM's scheduler process: imports vLLM and the standard library only.
"""

from __future__ import annotations

import logging
from typing import Any

from vllm.v1.kv_offload.tiering.base import TransferJob
from vllm.v1.kv_offload.tiering.example.manager import ExampleSecondaryTierManager

logger = logging.getLogger(f"vllm.offload_check.{__name__}")

LOG_HELD = "offload-check stalled tier: load job"  # the engine log line per held load


class NeverLoadsTier(ExampleSecondaryTierManager):
    """Stores complete at once; loads are held forever (their jobs never finish)."""

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **tier_config: Any,
    ) -> None:
        # The rest of the tier's config (a root_dir the harness gives every tier) is
        # for real tiers; this one keeps nothing on disk.
        super().__init__(
            offloading_spec=offloading_spec,
            primary_kv_view=primary_kv_view,
            tier_type=tier_type,
            backpressure_detector=backpressure_detector,
        )
        self.held = 0
        logger.warning(
            "%s tier ready, ignoring %s", LOG_HELD.rsplit(":", 1)[0], sorted(tier_config)
        )

    def submit_load(self, job_metadata: TransferJob) -> None:
        self.held += 1
        logger.warning(
            "%s %s of %d chunks held, never completed (%d held)",
            LOG_HELD,
            job_metadata.job_id,
            len(job_metadata.keys),
            self.held,
        )


__all__ = ["NeverLoadsTier"]
