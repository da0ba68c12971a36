"""Code that runs inside vLLM's own processes (API server, EngineCore, workers).

Only the standard library, torch and vLLM may be imported here: these modules are
loaded by vLLM's plugin machinery in every process it starts, where typer, rich,
pandas and the rest of the harness have no business being imported.
"""
