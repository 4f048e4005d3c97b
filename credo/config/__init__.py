"""Recipe configs: typed dataclasses loaded strictly from YAML plus `key=value` overrides.

    credo.config.fields     checked / ranged / one_of: each field's valid range declared beside it
    credo.config.sections   the core sections (run, model, task, sft, rollout, algo, optim, reward, stages)
    credo.config.load       load_recipe, recipe_class (core + each family's section), validate_recipe

Every field carries a one-line doc right under it. Loading fails before anything runs when a key is unknown
(naming the key, its path and the closest valid key), a value has the wrong type or is out of range, or
settings cannot work together. A family's section lives in its own folder (credo/families/<name>/config.py)
and joins the recipe through the family table (`credo.family`). Importing this package loads no other credo
module but `credo.errors`.
"""

from credo.config.fields import checked, one_of, ranged, two_betas
from credo.config.load import (check_fields, load_recipe, out_of_range, recipe_class, recipe_to_dict, recipe_to_yaml,
                               sft_enabled, validate_recipe)
from credo.config.sections import (AGG_MODES, AlgoConfig, LoraConfig, ModelConfig, OptimConfig, Recipe, RewardConfig,
                                   RolloutConfig, RunConfig, SFTConfig, StagesConfig, TaskConfig, TinyModelConfig)
from credo.errors import ConfigError

__all__ = ["AGG_MODES", "AlgoConfig", "ConfigError", "LoraConfig", "ModelConfig", "OptimConfig", "Recipe",
           "RewardConfig", "RolloutConfig", "RunConfig", "SFTConfig", "StagesConfig", "TaskConfig", "TinyModelConfig",
           "check_fields", "checked", "load_recipe", "one_of", "out_of_range", "ranged", "recipe_class",
           "recipe_to_dict", "recipe_to_yaml", "sft_enabled", "two_betas", "validate_recipe"]


def __getattr__(name: str):
    """Names that moved to a family's folder keep working for one release, with a DeprecationWarning."""
    from credo._moved import moved_attribute

    return moved_attribute(__name__, name)
