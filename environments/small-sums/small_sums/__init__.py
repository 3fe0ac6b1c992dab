from .taskset import SmallSumsTaskset

__all__ = ["SmallSumsTaskset"]
