"""A volunteer's side of a run (issue 27): its key (`keys.py`) and the worker (`worker.py`) that
joins a run's pool, pulls its weights, generates what it is leased with TOPLOC proofs, submits."""
