"""``offload-check namespace``: KV written to a disk tier by one server, read by a
restarted one with exactly one change; what each release reuses that it must not."""
