"""What a run leaves on disk: the run directory, its tables' schema and records, markdown
and chart helpers (imports no command).
"""
