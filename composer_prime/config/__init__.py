from composer_prime.config.loader import ConfigError, load, load_or_exit, write_toml
from composer_prime.config.links import RelayConfig
from composer_prime.config.models import InferenceConfig, OrchestratorConfig, SFTConfig, TrainerConfig
from composer_prime.config.rl import RLConfig

__all__ = ["ConfigError", "load", "load_or_exit", "write_toml", "InferenceConfig", "OrchestratorConfig", "RelayConfig", "RLConfig", "SFTConfig", "TrainerConfig"]
