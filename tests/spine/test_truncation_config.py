"""rollout.top_k / min_p / kept_set_replay: loaded strictly, refused (naming the key) where the rollout path would
drop them, and passed to the default source only when set (docs/truncated_sampling.md)."""

import pytest

from credo.config import ConfigError, load_recipe
from credo.config.truncation import truncation_kwargs


def recipe(*overrides):
    return load_recipe("recipes/quickstart.yaml", list(overrides), validate_names=False)


def test_defaults_pass_nothing_new_and_set_keys_pass_through():
    assert truncation_kwargs(recipe().rollout) == {}
    assert truncation_kwargs(recipe("rollout.kept_set_replay=true").rollout) == {}  # nothing cut: nothing to replay
    assert truncation_kwargs(recipe("rollout.top_p=0.9").rollout) == {}  # replay off: top_p alone, as before
    ro = recipe("rollout.top_k=5", "rollout.min_p=0.1", "rollout.kept_set_replay=true").rollout
    assert truncation_kwargs(ro) == dict(top_k=5, min_p=0.1, kept_set_replay=True)


@pytest.mark.parametrize("bad, key", [("rollout.top_k=-1", "rollout.top_k"), ("rollout.min_p=1.0", "rollout.min_p")])
def test_out_of_range_values_name_their_key(bad, key):
    with pytest.raises(ConfigError, match=key):
        recipe(bad)


@pytest.mark.parametrize("other", ["rollout.tail_batching={}", "stages.schedule=tail_batching",
                                   "stages.rollout=my_pkg.sources:make",
                                   "rollout.max_staleness=1 rollout.async_mode=overlap", "stages.schedule=overlap"])
def test_paths_that_would_drop_the_settings_are_refused(other):
    """At load (a family's or a user's source) or by the run plan (a schedule, however it is spelt)."""
    from credo.plan import resolve_plan

    def check(*overrides):
        r = recipe(*overrides)
        if r.stages.rollout == "default":  # the import spec is not importable here: load's own check comes first
            resolve_plan(r)

    with pytest.raises(ConfigError, match="rollout.top_k"):
        check("rollout.top_k=5", *other.split())
    with pytest.raises(ConfigError, match="rollout.kept_set_replay"):
        check("rollout.top_p=0.9", "rollout.kept_set_replay=true", *other.split())
    check("rollout.top_p=0.9", *other.split())  # top_p alone, without replay, is served as before
