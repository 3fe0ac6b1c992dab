from .taskset import ToolCalcTaskset

__all__ = ["ToolCalcTaskset"]
