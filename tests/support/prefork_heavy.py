"""What tests/support/prefork_entry.py names as its PRELOAD: a module its parent imports for it (test_prefork)."""
