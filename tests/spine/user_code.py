"""A user's own stage factories, for tests/spine/test_user_errors.py (an importable module the CLI loads by name)."""


def reward_stage_with_a_typo(ctx, **kwargs):
    """A reward stage factory whose body raises, as a user's factory with a mistake does while the run is built."""
    return {"scale": 1}["scael"]


def reward_stage_returning_nothing_usable(ctx, **kwargs):
    """Returns an object without the stage's interface: credo's own code then fails on it."""
    return 42


def a_reward_function_not_a_factory(responses, problems):
    """A group reward function named where a stage factory goes (stages.advantage): fn(ctx) cannot call it."""
    return [0.0 for _ in responses]


def advantage_stage_with_a_required_setting(ctx, *, scale):
    """A factory whose setting has no default: the recipe must give stages.advantage_kwargs.scale."""
    return None
