"""What the benchmarks share: a timed run of a command (timed.py) and several side by side (runs.py), their
command line and device settings (cli.py), the A/Bs' common parts (ab.py), and the race's one evaluator."""
