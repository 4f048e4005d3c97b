"""The built-in families, one folder each. A folder's `__init__` declares its `FAMILY` table entry and imports
only its config module; stages, hooks and models load when a recipe uses them (`credo.family`).

    critic/      PPO with value models and GAE; AsyPPO's mini-critics          section critic:
    mipu/        MIPU's accept-or-roll-back of each update                     section mipu:
    multiturn/   agents in GEM-protocol envs, turn credit, IPA resampling      section env:
    judges/      LLM judges as rewards; RM-NLHF, CE-RM, P-GenRM                section judge:
    attention/   attention-derived token credit, as a probe                    (stage settings only)
    complementary/  Complementary RL: actor + experience extractor, experience bank  section complementary:
    polymath/    one-sample RL, skill-ranked samples, multi-domain evaluation   section polymath:
    palette/     Reasoning Palette: a sampled latent decoded into soft prefixes section palette:
    agent/       agents that speak the OpenAI API, through credo's gateway     section agent:
    distill/     on-policy distillation: reverse KL to a teacher on the student's samples  section distill:

Adding a family: a folder with a `FAMILY = credo.family.Family(...)` in its `__init__`, listed in BUILTIN below
(or, outside credo, named in a recipe's `families:`). See docs/architecture.md, "Adding a family".
"""

import importlib

BUILTIN = ("critic", "mipu", "multiturn", "judges", "attention", "complementary", "polymath", "palette", "agent",
           "distill")
"""In this order their sections follow the core sections of a recipe."""


def builtin_families() -> list:
    return [importlib.import_module(f"credo.families.{name}").FAMILY for name in BUILTIN]
