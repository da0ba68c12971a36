"""The typer app: options, validation, exit codes; one thin layer over the commands."""
