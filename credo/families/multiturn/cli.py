"""The multi-turn family's part of `credo list` (`Family.listing`): the env ids `env.id` takes."""

from __future__ import annotations


def listing(names) -> str:
    """The built-in env ids, the adapters' prefixes and (with GEM installed) GEM's ids; `names(title, items,
    indent)` is the CLI's list formatter."""
    from credo.families.multiturn.envs import ADAPTERS, BUILTIN_ENVS

    try:
        from credo.families.multiturn.envs import gem_ids

        gem = names(f"  GEM ids ({len(gem_ids())}, gem.make)", gem_ids(), indent="    ")
    except Exception:  # noqa: BLE001 - gem not installed
        gem = "  GEM ids: pip install 'credo[envs]' to list them"
    return names("environments (env.id, with stages.rollout: multiturn)", sorted(BUILTIN_ENVS)
                 + [f"{prefix}<id>" for prefix in ADAPTERS]) + "\n" + gem
