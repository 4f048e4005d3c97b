"""The palette family: Reasoning Palette (arXiv 2512.17206), a latent reasoning context as learnable prefixes.

    config.py   the `palette:` section and its checks
    vae.py      the VAE: q(z | x, y) from the mean-pooled hidden state of a (question, answer) pair, z -> k prefix
                embeddings; its ELBO (reconstruction = the LM's likelihood of the answer after the prefix)
    warmup.py   the warm-up after credo's SFT: the VAE with the LM frozen, then a brief SFT with prefixes (cached)
    source.py   the `palette` rollout source: each response samples its own z (kept in Sample.meta), the engine
                reads the decoded prefix before the prompt, the trainer's forwards the same rows (Batch.prefix_embeds);
                the within-group diversity hook
    steer.py    inference with a chosen z: a z given, or the posterior mean of an example answer
    cli.py      `credo palette` (its verb, with steer.py)
    task.py     `add_two_ways`: addition demonstrated in two scratchpad strategies (the steering demo)
    build.py    build-time parts: the prefix-length check, the warm-up, the hook

Active when `palette.enabled` (the palette source replaces the default rollout source) or `palette.diversity_metrics`
alone (a baseline measured the same way). See docs/palette.md.
"""

from credo.families.palette.config import REFUSALS, PaletteConfig, check_palette
from credo.capabilities import PROMPT_EMBEDS
from credo.family import Family, StageEntry


def _section(r):
    return getattr(r, "palette", None)


def _active(r) -> bool:
    p = _section(r)
    return p is not None and (p.enabled or p.diversity_metrics)


def _stage_defaults(r) -> dict:
    p = _section(r)
    return {"rollout": "palette"} if p is not None and p.enabled else {}


FAMILY = Family(
    name="palette",
    doc="Reasoning Palette: a sampled latent decoded into soft prefixes, per response (arXiv 2512.17206)",
    section="palette",
    config=PaletteConfig,
    check=check_palette,
    stages={"rollout": {"palette": StageEntry("credo.families.palette.source:palette_source",
                                              backend_needs=frozenset({PROMPT_EMBEDS}))}},
    tasks={"add_two_ways": "credo.families.palette.task:add_two_ways"},
    active=_active,
    stage_defaults=_stage_defaults,
    refusals=REFUSALS,
    fixed_on_resume=("palette.enabled", "palette.latent_dim", "palette.prefix_len", "palette.hidden_size"),
    build="credo.families.palette.build",
    commands={"palette": "credo.families.palette.cli:add_parser"},
)
