"""offload-check: end-to-end validation of vLLM KV-cache offloading on Llama 4 models.

This package is imported inside vLLM processes (through the ``harness.engine``
plugin), so it must stay import-light: nothing here may pull in typer, rich or
pandas at import time.
"""

__version__ = "0.1.0"
