"""The one error an environment that cannot be used as configured raises, in a module that imports
nothing heavy: `rl` tells it apart from the others before verifiers (seconds to import) is loaded."""


class EnvError(Exception):
    """An environment that cannot be used as configured; the message is one line."""
