"""One vLLM server: its argv, launch and teardown, interpreters and release environments,
local models, workload, metrics, engine logs, KV layout, crash signatures.
"""
