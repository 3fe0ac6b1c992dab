from .taskset import ReverseTextTaskset

__all__ = ["ReverseTextTaskset"]
