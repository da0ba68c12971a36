"""``python -m harness``: the same command line as ``offload-check``."""

from harness.cli.app import main

main()
