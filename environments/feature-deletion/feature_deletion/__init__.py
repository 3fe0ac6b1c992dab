"""feature-deletion: the Taskset lands with the sandbox and scoring (in progress)."""
