"""``python -m harness.tools.gpu_rehearsal``: :func:`command_line.main`, and the worker
process other interpreters run (``--worker``, :mod:`worker`)."""

from __future__ import annotations

import sys

from harness.tools.gpu_rehearsal.command_line import main

if __name__ == "__main__":
    sys.exit(main())
