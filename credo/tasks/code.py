"""`code`: write the body of a short Python function from its description; hidden unit tests run it in the sandbox.

    prompt   "def f(x):  # multiply by 3, then add 1\\n    return "
    answer   "(x * 3) + 1"

The policy's response is appended to the prompt and run by `credo.sandbox.run_python` with the problem's hidden
test inputs; the reward is the fraction of tests whose `repr(f(x))` equals the reference's (computed on the host by
a function written from the steps, never by evaluating the answer text). `repr` makes the comparison exact: a
float where an int is due fails, which is what the SFT warm-up's stray '.' (`sft.noisy_frac`) turns `x * 3` into.

`sandbox_reward` is the group reward function to name in a recipe (`reward.function:
credo.tasks.code:sandbox_reward`): besides the pass rate it reports, per step, the fraction of programs that ended
for each sandbox reason (`reward/sandbox_timeout`, `reward/sandbox_memory`, `reward/sandbox_killed`, ...; the
reasons of `credo.sandbox.REASONS`). Each program runs in a sandbox of its own, so one sample's fork bomb or
timeout fails that sample only; a program already run is not run again (`check`).
"""

from __future__ import annotations

import json
import random
import threading
from collections import OrderedDict

from credo.errors import ConfigError
from credo.sandbox import REASONS, run_python
from credo.tasks.problem import Problem, SplitSpaceTask
from credo.tasks.registry import register_task

STEPS = {
    "add": ("add {n}", "+", lambda x, n: x + n),
    "sub": ("subtract {n}", "-", lambda x, n: x - n),
    "mul": ("multiply by {n}", "*", lambda x, n: x * n),
    "div": ("floor-divide by {n}", "//", lambda x, n: x // n),
    "mod": ("take the remainder mod {n}", "%", lambda x, n: x % n),
}
"""step name -> (its words, the Python operator, the reference on ints)."""

_HARNESS = """

import json as _json
_out = []
for _x in {inputs!r}:
    try:
        _out.append(repr(f(_x)))
    except MemoryError:  # past the sandbox's memory: the whole program fails (reward/sandbox_memory)
        raise
    except BaseException as _e:  # noqa: BLE001 - one test's exception fails that test only
        _out.append('raised ' + type(_e).__name__)
print()
print(_json.dumps(_out))
"""
"""Appended after the program: calls f on each hidden input, prints the reprs as the last line."""


@register_task("code")
class CodeTask(SplitSpaceTask):
    """`def f(x)` in one or two steps (add, subtract, multiply, floor-divide, remainder by a constant); reward the
    fraction of `num_tests` hidden inputs on which it returns the reference's value (see the module docstring).

    The problem space (every one-step and, with max_steps 2, two-step function over constants 1..max_constant) is
    shuffled once with the task seed; the first `eval_size` are held out.
    """

    def __init__(self, train_size: int, eval_size: int, seed: int, ops: str = "add,sub,mul", max_constant: int = 9,
                 max_steps: int = 2, num_tests: int = 5, timeout_s: float = 2.0, memory_mb: int = 128):
        names = [o.strip() for o in ops.split(",") if o.strip()]
        bad = [o for o in names if o not in STEPS]
        if not names or bad:
            raise ConfigError(f"task.kwargs.ops = {ops!r}: expected a comma-separated list of {', '.join(STEPS)}")
        for key, value, low in (("max_constant", max_constant, 1), ("max_steps", max_steps, 1),
                                ("num_tests", num_tests, 1), ("memory_mb", memory_mb, 32)):
            if not isinstance(value, int) or value < low:
                raise ConfigError(f"task.kwargs.{key} = {value!r}: expected an integer >= {low}")
        if max_steps > 2:
            raise ConfigError(f"task.kwargs.max_steps = {max_steps}: expected 1 or 2")
        if not timeout_s > 0:
            raise ConfigError(f"task.kwargs.timeout_s = {timeout_s!r}: expected > 0")
        one = [((o, n),) for o in names for n in range(1, max_constant + 1)]
        space = one + ([a + b for a in one for b in one] if max_steps == 2 else [])
        super().__init__([(s,) for s in space], train_size, eval_size, seed)
        self.num_tests, self.limits = num_tests, {"timeout_s": float(timeout_s), "memory_mb": memory_mb}

    def _problem(self, steps: tuple) -> Problem:
        words = ", then ".join(STEPS[o][0].format(n=n) for o, n in steps)
        expr = "x"
        for o, n in steps:
            expr = f"{expr} {STEPS[o][1]} {n}" if expr == "x" else f"({expr}) {STEPS[o][1]} {n}"
        rng = random.Random(repr(steps))  # the hidden inputs: fixed per problem, never in the prompt
        inputs = rng.sample(range(-20, 21), self.num_tests)
        return Problem(prompt=f"def f(x):  # {words}\n    return ", answer=expr,
                       meta={"inputs": inputs, "expected": [repr(reference(steps, x)) for x in inputs],
                             "sandbox": self.limits})

    @staticmethod
    def score(response: str, problem: Problem) -> float:
        """The fraction of hidden tests passed (the program run in the sandbox)."""
        return check(response, problem)[0]


def reference(steps: tuple, x: int) -> int:
    """f(x) computed from the steps on the host (not from the answer text)."""
    for o, n in steps:
        x = STEPS[o][2](x, n)
    return x


def check(response: str, problem: Problem) -> tuple[float, str]:
    """(fraction of tests passed, the sandbox's reason). Only the program's last stdout line is read: anything it
    prints itself cannot add passes unless it holds the right values, which is solving the task. Outcomes are
    remembered (the last 8192; not a timeout, which a loaded host can cause): the functions are pure, and a
    group's or an evaluation's samples repeat themselves."""
    key = (response, problem.prompt, tuple(problem.meta["inputs"]), tuple(sorted(problem.meta["sandbox"].items())))
    with _LOCK:
        if key in _SEEN:
            _SEEN.move_to_end(key)
            return _SEEN[key]
    res = run_python(problem.prompt + response + _HARNESS.format(inputs=problem.meta["inputs"]),
                     **problem.meta["sandbox"])
    expected = problem.meta["expected"]
    try:
        got = json.loads(res.stdout.rstrip("\n").rsplit("\n", 1)[-1]) if res.reason == "ok" else []
    except ValueError:
        got = []
    got = got if isinstance(got, list) else []
    outcome = (sum(isinstance(g, str) and g == e for g, e in zip(got, expected)) / len(expected), res.reason)
    if res.reason != "timeout":
        with _LOCK:
            _SEEN[key] = outcome
            while len(_SEEN) > 8192:
                _SEEN.popitem(last=False)
    return outcome


_SEEN: OrderedDict = OrderedDict()
_LOCK = threading.Lock()


class SandboxReward:
    """The group reward function of the `code` task: the pass rate, and per sandbox reason the share of the
    group's programs that ended for it (weight 0: logged as `reward/sandbox_<reason>`, not rewarded)."""

    names = ("pass_rate", *(f"reward/sandbox_{r}" for r in REASONS if r != "ok"))

    def __call__(self, responses: list[str], problems: list) -> "ScoredGroup":
        from credo.rewards.worker import ScoredGroup

        outcomes = [check(r, p) for r, p in zip(responses, problems)]
        raw = {"pass_rate": [o[0] for o in outcomes]}
        for name in self.names[1:]:
            reason = name.removeprefix("reward/sandbox_")
            raw[name] = [float(o[1] == reason) for o in outcomes]
        return ScoredGroup(raw, {name: 1.0 if name == "pass_rate" else 0.0 for name in self.names})


sandbox_reward = SandboxReward()
"""`reward.function: credo.tasks.code:sandbox_reward` in a recipe."""
