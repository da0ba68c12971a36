"""What a person reads: terminal tables, dry-run plans, the CI summary, compare, list."""
