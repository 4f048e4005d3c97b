"""The error types of credo, in a leaf module that imports nothing: every layer can raise them.

    ConfigError           a recipe, an override or a named target that cannot work; the message names the key
    TrainingError         the run cannot continue (repeated non-finite steps, a model that went non-finite)
    RewardFunctionError   a reward function broke its contract (wrong length, a non-number) or failed too often
    EnvFailureError       too many of a step's episodes failed (an env raised or hung)
    UnsafeFileError       a checkpoint or model file whose pickle names code outside the allow-list (never loaded)
"""


class ConfigError(ValueError):
    """A recipe or override that cannot be loaded; the message says what to fix."""


class TrainingError(RuntimeError):
    """The run cannot continue (repeated non-finite steps, broken reward function, bad input)."""


class RewardFunctionError(RuntimeError):
    """The reward function broke its contract (wrong length, a non-number) or failed too often."""


class EnvFailureError(RuntimeError):
    """Too many of a step's episodes failed (an env raised or hung)."""


class UnsafeFileError(ValueError):
    """A checkpoint or model file that could run code when loaded (a pickle naming a global outside credo's
    allow-list), or that an older credo wrote in such a form; the message names the file. Never loaded."""
