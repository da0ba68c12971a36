"""``python -m harness``: the same command line as ``offload-check``."""

from harness.cli import main

main()
