"""Offload-check bugs: the bug corpus, each entry's trigger on every release."""
