"""The error types of credo, in a leaf module that imports nothing: every layer can raise them.

    UserError             the base of every error a user can cause and fix (all below, and the Ray roles'
                          ClusterWorkerError): the CLI prints its message as one `credo: error:` line, no traceback
    ConfigError           a recipe, an override or a named target that cannot work; the message names the key
    TrainingError         the run cannot continue (repeated non-finite steps, a model that went non-finite)
    RewardFunctionError   a reward function broke its contract (wrong length, a non-number) or failed too often
    EnvFailureError       too many of a step's episodes failed (an env raised or hung)
    UnsafeFileError       a checkpoint or model file whose pickle names code outside the allow-list (never loaded)
"""


class UserError(Exception):
    """An error the user caused and can fix (a setting, their code, their cluster); the message says what to fix.

    The rule (docs/getting-started.md, "Run a recipe"): credo raises a UserError subclass for every
    problem the user can cause, and the CLI prints it as one line; an exception raised inside the user's own code
    (a reward function, a stage factory, a plugin) is shown as one line naming their file and line; any other
    exception is a bug in credo and keeps its traceback.
    """


class ConfigError(UserError, ValueError):
    """A recipe or override that cannot be loaded; the message says what to fix."""


class TrainingError(UserError, RuntimeError):
    """The run cannot continue (repeated non-finite steps, broken reward function, bad input)."""


class RewardFunctionError(UserError, RuntimeError):
    """The reward function broke its contract (wrong length, a non-number) or failed too often."""


class EnvFailureError(UserError, RuntimeError):
    """Too many of a step's episodes failed (an env raised or hung)."""


class UnsafeFileError(ValueError):
    """A checkpoint or model file that could run code when loaded (a pickle naming a global outside credo's
    allow-list), or that an older credo wrote in such a form; the message names the file. Never loaded."""
