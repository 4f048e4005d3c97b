"""What a family declares instead of what the core names (issue 51, item 4): its CLI verbs (`Family.commands`) and
its part of `credo list` (`Family.listing`), its Ray roles (`Family.roles`, under `cluster:`), and which rollout
stages play the `env:` section (the `env_episodes` capability), so no family changes another's module state when it
is imported."""

from __future__ import annotations

import ast
import dataclasses
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from credo.config import load_recipe
from credo.config.fields import ranged
from credo.config.sections import ClusterConfig, RoleConfig
from credo.errors import ConfigError
from credo.family import Family, builtin_families, family_commands, family_listings, load_families

REPO = Path(__file__).resolve().parents[2]
HERE = "tests.spine.test_family_declarations"
QUICK = str(REPO / "recipes" / "quickstart.yaml")


# ------------------------------------------------------------------------------------------------ CLI verbs
def add_hello(sub) -> None:
    p = sub.add_parser("hello", help="say hello from a family declared in a test")
    p.add_argument("--to", default="world", help="whom to greet")
    p.set_defaults(handler=lambda args: print(f"hello {args.to}") or 7, needs_logging=False)


def hello_listing(names) -> str:
    return names("greetings (a test family's part of credo list)", ["hello", "hi"])


HELLO = Family(name="hello", commands={"hello": f"{HERE}:add_hello"}, listing=f"{HERE}:hello_listing")


def test_an_unknown_verb_module_is_an_error_naming_the_family_the_verb_and_the_module():
    broken = Family(name="broken", commands={"frob": "credo.no_such_module:add_parser"})
    with pytest.raises(ConfigError, match=r"family 'broken' commands\['frob'\] = 'credo.no_such_module:add_parser': "
                                          r"cannot import module 'credo.no_such_module'"):
        family_commands((broken,))
    missing = Family(name="broken", commands={"frob": f"{HERE}:no_such_function"})
    with pytest.raises(ConfigError, match=rf"module '{HERE}' has no attribute 'no_such_function'"):
        family_commands((missing,))
    with pytest.raises(ConfigError, match=r"family 'hello' commands\['hello'\].*the verb 'credo hello' is already taken"):
        family_commands((HELLO,), {"hello"})
    with pytest.raises(ConfigError, match="the command 'hello' is claimed by both family 'hello' and family 'again'"):
        load_families((f"{HERE}:HELLO", f"{HERE}:AGAIN"))


AGAIN = Family(name="again", commands={"hello": f"{HERE}:add_hello"})


def test_the_cli_adds_each_familys_verbs_from_the_table_and_names_no_family(monkeypatch, capsys):
    import credo.family
    from credo import cli

    declared = {verb: fam.name for fam in builtin_families() for verb in fam.commands}
    assert {"bon", "palette"} <= set(declared)
    parser = cli._parser()
    sub = next(a for a in parser._actions if hasattr(a, "choices") and isinstance(a.choices, dict))
    assert set(declared) <= set(sub.choices)
    args = parser.parse_args(["bon", "r.yaml", "--n", "2"])  # the judges family's handler, from its own module
    assert args.handler.__module__ == "credo.families.judges.cli" and args.n == [2]
    # cli.py names no family: no family module, and none of the verbs the families declare
    tree = ast.parse((REPO / "credo" / "cli.py").read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not [s for s in strings if "credo.families" in s or s in declared]
    # a family added to the table brings its verb and its listing, with no change to cli.py
    monkeypatch.setattr(credo.family, "builtin_families", lambda: (*builtin_families(), HELLO))
    assert cli.main(["hello", "--to", "families"]) == 7
    assert capsys.readouterr().out == "hello families\n"
    # its part of `credo list`, formatted by the CLI (tests/spine/test_cli.py sees the multi-turn env ids there)
    listings = family_listings(credo.family.builtin_families())
    assert [f(cli._names) for f in listings][-1] == "greetings (a test family's part of credo list):\n  hello, hi"


# ------------------------------------------------------------------------------------------------ Ray roles
@dataclass
class ScorerRoleConfig(RoleConfig):
    """`cluster.scorer:`: a test family's role."""

    batch: int = ranged(8, ge=1)
    """Requests one scorer worker takes at once."""


SCORER = Family(name="scorer", roles={"scorer": ScorerRoleConfig})
CLASH = Family(name="clash", roles={"rollout": RoleConfig})
NOT_A_ROLE = Family(name="notrole", roles={"thing": dict})


def test_the_core_cluster_names_no_family_role_and_the_families_roles_load_as_before():
    core = {f.name for f in dataclasses.fields(ClusterConfig)}
    assert {"rollout", "reward"} <= core and not {"judge", "env"} & core
    r = load_recipe(QUICK, ["cluster.judge.workers=2", "cluster.judge.resources={GPU: 1}",
                            "cluster.env.max_concurrency=5"])
    assert (r.cluster.judge.workers, r.cluster.judge.resources, r.cluster.env.max_concurrency) == (2, {"GPU": 1}, 5)
    assert (r.cluster.env.workers, r.cluster.judge.max_restarts) == (1, 3)  # the defaults of before
    with pytest.raises(ConfigError, match=r"config key 'cluster.judge.workers' = -1 is out of range: expected >= 0"):
        load_recipe(QUICK, ["cluster.judge.workers=-1"])
    with pytest.raises(ConfigError, match=r"unknown config key 'cluster.judge.wrkers'; did you mean "
                                          r"'cluster.judge.workers'\?"):
        load_recipe(QUICK, ["cluster.judge.wrkers=1"])
    with pytest.raises(ConfigError, match=r"config key 'cluster.env.resources' has 'gpu': Ray's names are "
                                          r"case-sensitive, expected 'GPU'"):
        load_recipe(QUICK, ["cluster.engine=ray", "cluster.env.resources={gpu: 1}"])
    from credo.distributed.ray.config import check_placement

    with pytest.raises(ConfigError, match=r"config key 'cluster.judge.resources' = \{'GPU': 1\}: .*role 'judge' "
                                          "cannot be placed"):
        check_placement(r.cluster, [{"Alive": True, "Resources": {"CPU": 4.0}}])


def test_a_recipes_own_family_adds_a_role_and_a_clash_with_the_core_is_an_error():
    r = load_recipe({"families": [f"{HERE}:SCORER"], "run": {"name": "t"}},
                    ["cluster.scorer.batch=3", "cluster.scorer.workers=2"])
    assert (r.cluster.scorer.batch, r.cluster.scorer.workers, r.cluster.judge.workers) == (3, 2, 1)
    with pytest.raises(ConfigError, match=r"config key 'cluster.scorer.batch' = 0 is out of range"):
        load_recipe({"families": [f"{HERE}:SCORER"], "run": {"name": "t"}}, ["cluster.scorer.batch=0"])
    with pytest.raises(ConfigError, match="unknown config key 'cluster.scorer'"):
        load_recipe(QUICK, ["cluster.scorer.workers=2"])  # without the family, no such role
    with pytest.raises(ConfigError, match="family 'clash' declares the cluster role 'rollout', which is a core key"):
        load_recipe({"families": [f"{HERE}:CLASH"], "run": {"name": "t"}})
    with pytest.raises(ConfigError, match="family 'notrole' declares the cluster role 'thing' as <class 'dict'>"):
        load_recipe({"families": [f"{HERE}:NOT_A_ROLE"], "run": {"name": "t"}})


# ------------------------------------------------------------------------------------------------ import order
PROBE = r"""
import importlib, json, sys
from credo.families import BUILTIN

def state():
    # every mutable module-level value of the families' modules loaded so far
    out = {}
    for name, mod in sorted(sys.modules.items()):
        if name.startswith("credo.families") and mod is not None:
            for key, value in vars(mod).items():
                if isinstance(value, (set, frozenset, dict, list)) and not key.startswith("__"):
                    out[f"{name}.{key}"] = repr(sorted(value, key=repr) if isinstance(value, (set, frozenset))
                                                else value)
    return out

changed = []
for fam in sys.argv[1].split(","):
    before = state()
    importlib.import_module(f"credo.families.{fam}")
    after = state()
    changed += [f"{fam}: {k}" for k in before if after.get(k) != before[k]]

from credo.config import load_recipe
from credo.errors import ConfigError

def outcome(overrides):
    try:
        load_recipe("recipes/complementary.yaml", overrides)
        return "ok"
    except ConfigError as e:
        return str(e)

print(json.dumps({"changed": changed, "checks": [outcome([]), outcome(["stages.rollout=default"]),
                                                   outcome(["env.id=null"])]}))
"""


def _probe(order: list[str]) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, ",".join(order)], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_no_family_changes_another_familys_module_state_at_import():
    from credo.families import BUILTIN

    orders = [list(BUILTIN), list(reversed(BUILTIN)), ["complementary", "multiturn"]]
    results = [_probe(order) for order in orders]
    for order, res in zip(orders, results):
        assert res["changed"] == [], (order, res["changed"])
    # the multi-turn check behaves the same whatever was imported first
    assert all(res["checks"] == results[0]["checks"] for res in results)
    ok, other_source, no_env = results[0]["checks"]
    assert ok == "ok"
    assert "expected stages.rollout: complementary or multiturn" in other_source
    assert "config key 'stages.rollout' = 'complementary' needs an environment" in no_env
