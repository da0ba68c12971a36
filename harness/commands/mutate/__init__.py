"""mutate: would the harness notice if vLLM's offloading code were wrong?

Each mutant is a one-token change to an installed vLLM file (``<`` -> ``<=``, ``+`` ->
``-``, a dropped ``not``, a loop that never runs), run in a copy of the environment of its
own; a mutant the harness's checks do not kill points at a behaviour nothing checks.

By job: ``mutants`` (which mutants a file has, with cosmic-ray's operators, and each one's
text), ``sandbox`` (copy-on-write copies of the environment, one mutated file each; the
installed files are never written), ``session`` (the resumable, shardable sqlite store of
mutants and verdicts, a cosmic-ray WorkDB underneath).
"""

from harness.commands.mutate.mutants import (
    REDUCED_OPERATORS,
    Mutant,
    enumerate_mutants,
    mutated_source,
    resolve_target,
    sample,
    site_packages,
)
from harness.commands.mutate.sandbox import (
    env_prefix,
    file_sha256,
    make_copy,
    remove_copy,
    replace_module,
)
from harness.commands.mutate.session import VERDICTS, Session, merge

__all__ = [
    "REDUCED_OPERATORS",
    "VERDICTS",
    "Mutant",
    "Session",
    "enumerate_mutants",
    "env_prefix",
    "file_sha256",
    "make_copy",
    "merge",
    "mutated_source",
    "remove_copy",
    "replace_module",
    "resolve_target",
    "sample",
    "site_packages",
]
