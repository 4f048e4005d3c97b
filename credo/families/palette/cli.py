"""`credo palette RUN_DIR --prompt P --z ...`: a Reasoning Palette run sampled with a chosen latent (the palette
family's verb, `Family.commands`; imports nothing heavy until it runs)."""

from __future__ import annotations


def add_parser(sub) -> None:
    """`credo palette RUN --prompt P [--z ...]`."""
    p_pal = sub.add_parser("palette", help="sample a Reasoning Palette run with a chosen latent z (steers its strategy; "
                           "credo.families.palette.steer)")
    p_pal.add_argument("run", help="a run folder trained with palette.enabled, or a palette model folder")
    p_pal.add_argument("--prompt", required=True, help="the prompt text, e.g. 47+86=")
    p_pal.add_argument("--z", default=None, help="the latent: latent_dim comma-separated numbers")
    p_pal.add_argument("--like", default=None, help="an example answer: z = the encoder's posterior mean of it")
    p_pal.add_argument("--like-prompt", default=None, help="the example answer's question (default: --prompt)")
    p_pal.add_argument("--samples", type=int, default=4, help="completions (without --z/--like: z ~ N(0, I) each)")
    p_pal.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy)")
    p_pal.add_argument("--max-new-tokens", type=int, default=32, help="length cap of a completion")
    p_pal.add_argument("--seed", type=int, default=0, help="seed of the z draws and of the sampling")
    p_pal.set_defaults(handler=palette, needs_logging=False)


def palette(args) -> int:
    from credo.families.palette.steer import main as steer

    return steer(args)
