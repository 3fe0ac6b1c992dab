"""feature-deletion: rebuild a function deleted from a real Python project; reward = its tests
passing again, scored in a sandbox.

The Taskset is imported on first use: building tasks (`composer-prime env build-tasks`) needs
only the generator, not verifiers (several seconds to import).
"""

__all__ = ["FeatureDeletionTaskset"]


def __getattr__(name: str):
    if name == "FeatureDeletionTaskset":
        from feature_deletion.taskset import FeatureDeletionTaskset

        return FeatureDeletionTaskset
    raise AttributeError(f"module 'feature_deletion' has no attribute {name!r}")
