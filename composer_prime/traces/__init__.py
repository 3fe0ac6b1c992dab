"""Trace replay's data side: recorded agent sessions in, normalised steps out (ingest)."""
