"""The ``offload-check`` command line: the typer app and the guard (``app``), the shared
options (``options``), helpers (``common``) and run directories (``runs``), then one thin
module per command (or family: ``envs``)."""
