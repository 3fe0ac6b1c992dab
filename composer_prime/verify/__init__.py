"""Checking what an untrusted inference node sends (issue 27): TOPLOC proofs over its last hidden
states (`toploc.py`), and its sampling against the trusted model (`sampling.py`). Both measure;
the thresholds are config (`config/volunteers.py`), calibrated by `benchmarks/volunteers.py`."""
