"""The error the unit tier's rule raises (tests/unit/conftest.py), in a module of its own so that
the tier's test and its conftest name the same class."""


class UnitTierViolation(RuntimeError):
    """A unit test started a process, opened a socket or bound a ZMQ endpoint beyond inproc://."""
