"""Fuzzing recipe loading and `credo check` (issue 56 item 7, docs/security.md): random keys, types, values and YAML
documents. Every input either loads or raises `ConfigError` (the CLI: exits 0, or 2 with one `credo: config error:`
line and no traceback); none hangs (each example has a deadline).

The keys are drawn from the recipe's own schema (every dotted key of the default recipe, so the values reach each
field's checks), mutated (a typo, a key below a leaf, an unknown section) or random text; values from YAML scalars,
lists, mappings, odd strings and large numbers. The examples run per test are `EXAMPLES` in CI; the heavy sibling
runs `HEAVY_EXAMPLES` (CREDO_FUZZ_EXAMPLES overrides both).
"""

from __future__ import annotations

import dataclasses
import io
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import yaml

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from credo.config import ConfigError, load_recipe, recipe_class  # noqa: E402

EXAMPLES = int(os.environ.get("CREDO_FUZZ_EXAMPLES", 30))
HEAVY_EXAMPLES = int(os.environ.get("CREDO_FUZZ_EXAMPLES", 3000))
DEADLINE_MS = 30000  # a recipe loads in well under a second once imports are warm (`warm`); a blow-up fails
HANG_S = 600  # pytest-timeout: a hang (which a deadline, measured after the example returns, cannot catch) fails


def _keys(cls, prefix: str = "") -> list[str]:
    out = []
    for f in dataclasses.fields(cls):
        typ = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(typ):
            out.append(prefix + f.name)
            out += _keys(typ, f"{prefix}{f.name}.")
        else:
            out.append(prefix + f.name)
    return out


KEYS = _keys(recipe_class())
IDENT = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
    st.text(max_size=20), st.sampled_from(["", "auto", "hf", "vllm", "tiny", "nan", "inf", "-1", "1e400", "~",
                                          "null", "True", "{", "[", "a:b", "os:system", "x" * 300, "\x00", "'"]))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.one_of(IDENT, st.sampled_from(KEYS)),
                                                                       inner, max_size=4)), max_leaves=8)
KEY = st.one_of(
    st.sampled_from(KEYS),
    st.builds(lambda k, t: k + t, st.sampled_from(KEYS), st.sampled_from([".x", "x", ".", "..", ".0", "[0]", " "])),
    IDENT,
)


def _override_text(key: str, value) -> str:
    raw = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
    return f"{key}={raw.removesuffix('...').strip()}"


OVERRIDE = st.one_of(st.builds(_override_text, KEY, VALUES), st.text(max_size=40))


def _loads_or_config_error(path, overrides) -> None:
    try:
        load_recipe(path, overrides)
    except ConfigError as e:
        msg = str(e)
        assert msg.strip(), "a ConfigError with no message"


@pytest.fixture(scope="module", autouse=True)
def warm():
    """A first load imports what the name checks need (seconds on a loaded machine): done before the deadlines."""
    load_recipe(str(Path(__file__).resolve().parents[2] / "recipes/quickstart.yaml"), [])


_SETTINGS = dict(deadline=DEADLINE_MS, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                              HealthCheck.filter_too_much], derandomize=True)


@pytest.mark.timeout(HANG_S)
@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(st.lists(OVERRIDE, max_size=4))
def test_overrides_load_or_raise_config_error(overrides):
    _loads_or_config_error(None, overrides)


RECIPE_DICTS = st.dictionaries(st.one_of(st.sampled_from([k for k in KEYS if "." not in k]), IDENT),
                               st.one_of(st.dictionaries(st.one_of(st.sampled_from([k.split(".")[-1] for k in KEYS]),
                                                                   IDENT), VALUES, max_size=4), VALUES), max_size=4)
DOCUMENTS = st.one_of(
    st.builds(lambda d: yaml.safe_dump(d, allow_unicode=True), RECIPE_DICTS),
    st.text(max_size=200),
    st.sampled_from(["", "---\n---\n", "run: !!python/object/apply:os.system ['touch /tmp/x']", "a: &a [*a]",
                     "run: {steps: 1e9999}", "- 1\n- 2", "run:\n  steps: [1,", "\t: x", "? [a]\n: b",
                     "run: &r {steps: 2}\nsft: *r", "<<: {run: {steps: 2}}", "run: {<<: {steps: 2}}"]),
)


@pytest.mark.timeout(HANG_S)
@settings(max_examples=EXAMPLES, **_SETTINGS)
@given(DOCUMENTS)
def test_yaml_documents_load_or_raise_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "recipe.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _loads_or_config_error(path, [])


def _credo_check(argv: list[str]) -> tuple[int, str]:
    from credo.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's usage errors
            code = e.code
    return code, err.getvalue()


@pytest.fixture(scope="module")
def warm_cli():
    """One `credo check` before the timed examples: its first call imports what the checks need (seconds)."""
    assert _credo_check(["check", str(Path(__file__).resolve().parents[2] / "recipes/quickstart.yaml")])[0] == 0


@pytest.mark.heavy  # 294 s in a CI run at load (each example a whole credo check); the load-level fuzz tests stay in CI
@pytest.mark.timeout(HANG_S)
@settings(max_examples=max(EXAMPLES // 3, 10), **_SETTINGS)
@given(DOCUMENTS, st.lists(OVERRIDE, max_size=3))
def test_credo_check_exits_0_or_2_with_one_line_and_no_traceback(warm_cli, tmp_path_factory, text, overrides):
    path = tmp_path_factory.mktemp("fuzz") / "recipe.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code, err = _credo_check(["check", str(path), *overrides])
    assert code in (0, 2), (code, err)
    assert "Traceback" not in err
    lines = [x for x in err.strip().splitlines() if "deprecated" not in x]  # a deprecated key's warning may precede
    if code == 2 and "usage:" not in err:  # argparse's usage errors are its own two lines
        assert len(lines) == 1 and lines[0].startswith("credo: config error:"), err


@pytest.mark.heavy
@pytest.mark.timeout(HANG_S * 6)
@settings(max_examples=HEAVY_EXAMPLES, **{**_SETTINGS, "derandomize": False})
@given(st.one_of(DOCUMENTS, st.none()), st.lists(OVERRIDE, max_size=5))
def test_many_more_recipes_and_overrides(tmp_path_factory, text, overrides):
    path = None
    if text is not None:
        path = tmp_path_factory.mktemp("fuzz") / "recipe.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
    _loads_or_config_error(path, overrides)


def test_a_yaml_python_tag_is_refused_and_runs_nothing(tmp_path):
    """yaml.safe_load: a `!!python/object/apply` tag is a ConfigError naming the file, and its call never runs."""
    marker = tmp_path / "marker"
    path = tmp_path / "recipe.yaml"
    path.write_text(f"run: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match=f"recipe '{path}' is not valid YAML"):
        load_recipe(path, [])
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_recipe(None, [f"run=!!python/object/apply:os.system ['touch {marker}']"])
    assert not marker.exists()


def test_a_null_or_compound_yaml_key_is_a_config_error(tmp_path):
    """Found by the heavy fuzz test: YAML's '?' parses as {None: None}, and OmegaConf raised its own
    KeyValidationError instead of a ConfigError."""
    from credo.config import ConfigError, load_recipe

    for text, says in (("?\n", "has a key None: expected a name"), ("run:\n  ~: 1\n", "has a key None"),
                       ("? [a, b]\n: 1\n", "is not valid YAML.*unhashable key")):
        f = tmp_path / "r.yaml"
        f.write_text(text)
        with pytest.raises(ConfigError, match=says):
            load_recipe(f)
