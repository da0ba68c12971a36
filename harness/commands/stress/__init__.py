"""Offload-check stress: seeded concurrent traffic judged against a connector-off reference."""
