"""What the benchmarks share: a timed run of a command, and the race's one evaluator."""
