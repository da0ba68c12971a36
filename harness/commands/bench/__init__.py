"""Offload-check bench: the harness's own costs, measured side by side."""
