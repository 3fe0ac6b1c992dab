"""Environment tooling: `uv run composer-prime env ...` (build tasks, scaffold, validate, hub)."""
