"""One package or module per command: plan, execute, judge, its files."""
