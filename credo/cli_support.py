"""What the CLI prints beside its commands: `credo run --help`'s list of settings, and how an error that is no
`credo.errors.UserError` is shown (one line for the user's own code, a plain traceback for a bug in credo)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path


def section_docs(section: str = "RunConfig") -> list[tuple[str, str]]:
    """(field, first line of its docstring) of a dataclass in credo/config/sections.py, read from the source
    (no import: `credo --help` stays instant)."""
    import ast

    tree = ast.parse((Path(__file__).resolve().parent / "config" / "sections.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == section)
    out = []
    for node, after in zip(cls.body, cls.body[1:] + [None]):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            doc = after.value.value if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) else ""
            out.append((node.target.id, " ".join(str(doc).split())))
    return out


def recipe_keys_named(name: str) -> list[str]:
    """The core recipe keys whose last part is `name` (`steps` -> run.steps, sft.steps), read from the source as
    `section_docs` reads it."""
    import ast

    tree = ast.parse((Path(__file__).resolve().parent / "config" / "sections.py").read_text())
    recipe = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Recipe")
    out = []
    for node in recipe.body:
        if (isinstance(node, ast.AnnAssign) and isinstance(node.annotation, ast.Name)
                and isinstance(node.target, ast.Name)):
            try:
                fields = [f for f, _ in section_docs(node.annotation.id)]
            except StopIteration:  # not a section class of sections.py
                continue
            if name in fields:
                out.append(f"{node.target.id}.{name}")
    return out


def unknown_option_line(command: str, unknown: list[str]) -> str | None:
    """One line for an option `credo COMMAND` does not have (`credo run recipe.yaml --steps 5`): argparse printed its
    top-level usage and 'unrecognized arguments: --steps 5 run.output_dir=...', every argument after the flag
    included, as if those were wrong too (issue 57's round-4 trial). Recipe settings are key=value: when the option
    names a recipe key (`--steps`, `--run.steps`, `--lr=1e-3`), the line gives the override. None when nothing
    unknown is an option (argparse's own message then)."""
    at = next((i for i, a in enumerate(unknown) if a.startswith("-") and len(a) > 1), None)
    if at is None:
        return None
    opt = unknown[at]
    name, eq, value = opt.lstrip("-").partition("=")
    if not eq:
        nxt = unknown[at + 1] if at + 1 < len(unknown) else ""
        value = nxt if nxt and not nxt.startswith("-") and "=" not in nxt else "VALUE"
    name = name.replace("-", "_")
    keys = [name] if "." in name else recipe_keys_named(name)
    line = f"credo: error: credo {command} has no option '{opt.partition('=')[0]}'"
    if keys:
        overrides = " or ".join(f"{k}={value}" for k in keys)
        return f"{line}; recipe keys are set as key=value: did you mean {overrides}?"
    return line + f" (`credo {command} --help` lists its options; recipe keys are set as key=value)"


def run_settings_help() -> str:
    """`credo run --help`'s list of the run.* settings (any recipe key is set the same way, key=value)."""
    rows = [f"  run.{name:<22s} {textwrap.shorten(doc, 90, placeholder='...')}" for name, doc in section_docs("RunConfig")]
    return ("run settings (override any recipe key as key=value; `credo check RECIPE --show` prints every key):\n"
            + "\n".join(rows))


def user_frame(e: BaseException):
    """The innermost frame of `e`'s traceback when it lies in the user's own code (not credo, not an installed
    package, not Python's library): the reward function, stage factory or plugin that raised; else None."""
    import sysconfig
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    if not frames:
        return None
    ours = str(Path(__file__).resolve().parent)
    libs = {str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    last = frames[-1]
    where = str(Path(last.filename).resolve())
    if where.startswith(ours) or any(where.startswith(lib) for lib in libs) or last.filename.startswith("<"):
        return None
    return last


def unexpected(e: Exception) -> int | None:
    """An exception that is no UserError: raised in the user's own code, one line naming their file and line (the
    traceback with CREDO_TRACEBACK=1); otherwise a bug in credo, its traceback, printed here so that a world of one
    does not get torch.distributed's `[rank0]:` prefix on every line. None: raise it (ranks of a larger world)."""
    import traceback

    frame = user_frame(e)
    if frame is not None and os.environ.get("CREDO_TRACEBACK", "0") in ("", "0"):
        print(f"credo: error: {type(e).__name__} in your code ({frame.filename}:{frame.lineno}, in {frame.name}): {e} "
              "(CREDO_TRACEBACK=1 shows the traceback)", file=sys.stderr)
        return 1
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return None  # torchrun's ranks: its rank prefix says which process failed
    traceback.print_exception(e)
    return 1
