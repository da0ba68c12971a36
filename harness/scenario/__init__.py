"""What the user wrote: the pydantic models of every file kind, expectation rules."""
