"""The `complementary` rollout source: the multi-turn source (credo/families/multiturn/source.py) whose episodes
carry lessons of the experience bank in their first observation (arXiv 2603.17621).

Per step, each game's G episodes: the first round(experience_frac * G) are shown the bank's entry for the game's
task (`note: <lesson>` above the first observation), the rest are shown nothing; a task without an entry (an empty
bank at the first steps) shows nothing to every episode (counted: complementary/no_entry_frac). With
`conditional_groups`, the group ids are per (game, shown entry id and version) (`credit.conditional_group_ids`), so
the GRPO baseline of an episode is taken among episodes that saw the same context.

With `complementary.extractor: self` (the one-model mode) the actor is its own extractor: after the episodes, the
source has the actor sample lessons from the extractor's prompt, measures them on paired episodes and appends them
to the batch as samples of their own (`add_lessons`), so they train in the actor's update.

Per sample `meta`: `experience` ({id, version, text} of the shown entry, or None), `task_key`. The bank is this
source's state (JSON in the checkpoint); the extractor hook (hook.py) consolidates it after each step.
"""

from __future__ import annotations

import torch

from credo.errors import ConfigError
from credo.families.complementary.bank import ExperienceBank
from credo.families.complementary.credit import conditional_group_ids
from credo.families.multiturn.source import MultiTurnRollout
from credo.tasks import Problem
from credo.train.batch import Batch

NOTE = "note: "
"""How a lesson is shown above the first observation (envs with `pin_note` render it themselves the same way)."""


class NotedEnv:
    """An env with a lesson shown above its first observation (for envs without `pin_note`)."""

    def __init__(self, env, note: str):
        self.env, self.note = env, note

    def reset(self, seed=None):
        obs, info = self.env.reset(seed=seed)
        return (f"{NOTE}{self.note}\n{obs}" if self.note else obs), info

    def step(self, action):
        return self.env.step(action)


def with_note(env, note: str):
    """`env` showing `note` ('' = nothing) above its next reset's first observation."""
    if hasattr(env, "pin_note"):
        env.pin_note(note)
        return env
    return NotedEnv(env, note) if note else env


def strip_note(observation: str) -> str:
    """The first observation without a shown lesson."""
    return observation.split("\n", 1)[1] if observation.startswith(NOTE) and "\n" in observation else observation


class ComplementaryRollout(MultiTurnRollout):
    """The multi-turn source with bank lessons in the prompt (see the module docstring)."""

    def __init__(self, env_cfg, section, tokenizer, backend, **kw):
        super().__init__(env_cfg, tokenizer, backend, **kw)
        self.c = section
        self.bank = self.new_bank()
        self.beside = None  # complementary.extractor_async: the extractor's worker (beside.Beside), set by the hook
        self.bank_step = 0  # with it: the last step whose extractor work the installed bank holds
        self._shown: list = []
        self._keys: dict[int, str] = {}

    def new_bank(self) -> ExperienceBank:
        c = self.c
        return ExperienceBank(add_min=c.add_min, capacity=c.capacity, min_uses=c.min_uses, delete_below=c.delete_below)

    def install(self, bank: ExperienceBank, step: int) -> None:
        """complementary.extractor_async: the bank the extractor's work on step `step` left becomes the one shown."""
        self.bank, self.bank_step = bank, step

    # ---- task keys and retrieval
    def task_key(self, env_seed: int) -> str:
        """The task an env seed plays: the env's task_id(seed) (retrieval by task), else its first observation."""
        if env_seed not in self._keys:
            env = self.env_factory()
            if self.c.retrieval == "task" and hasattr(env, "task_id"):
                key = str(env.task_id(env_seed))
            else:
                env = with_note(env, "")
                key = strip_note(str(env.reset(seed=env_seed)[0]))
            if len(self._keys) > 100_000:
                self._keys.clear()
            self._keys[env_seed] = key
        return self._keys[env_seed]

    def lookup(self, key: str):
        if self.c.retrieval == "task":
            return self.bank.retrieve(key)
        return self.bank.retrieve_similar(key, self.c.similarity_threshold)

    def envs_with_notes(self, notes: list[str]) -> list:
        return [with_note(self.env_factory(), n) for n in notes]

    # ---- the multi-turn source's seams
    def step_envs(self, env_seeds: list[int]) -> list:
        on = round(self.c.experience_frac * self.G) if self.c.extractor != "none" else 0
        self._shown = []
        for i, s in enumerate(env_seeds):
            entry = self.lookup(self.task_key(s)) if i % self.G < on else None
            self._shown.append(None if entry is None else (entry.id, entry.version, entry.text))
        return self.envs_with_notes([e[2] if e else "" for e in self._shown])

    def eval_envs(self, env_seeds: list[int]) -> list:
        inject = self.c.inject_in_eval and self.c.extractor != "none"
        entries = [self.lookup(self.task_key(s)) if inject else None for s in env_seeds]
        return self.envs_with_notes([e.text if e else "" for e in entries])

    def rollout(self, step: int) -> Batch:
        batch = super().rollout(step)
        games = batch.group_ids.tolist()
        for s, shown, game in zip(batch.samples, self._shown, games):
            s.meta["experience"] = None if shown is None else {"id": shown[0], "version": shown[1], "text": shown[2]}
            s.meta["task_key"] = self.task_key(s.meta["env_seed"])
            s.meta["game"] = game
        if self.c.conditional_groups:
            batch.group_ids = conditional_group_ids(games, [x[:2] if x else None for x in self._shown], self.G)
        on = round(self.c.experience_frac * self.G) if self.c.extractor != "none" else 0
        meant = [i % self.G < on for i in range(len(self._shown))]
        n_meant = max(1, sum(meant))
        batch.metrics.update({
            "complementary/injected_frac": sum(x is not None for x in self._shown) / max(1, len(self._shown)),
            "complementary/no_entry_frac": sum(m and x is None for m, x in zip(meant, self._shown)) / n_meant
            if any(meant) else 0.0,
            "complementary/bank_size": len(self.bank), "complementary/bank_version": self.bank.version})
        if self.beside is not None:  # steps whose extractor work the shown bank lacks (beside.py: at most 1)
            batch.metrics["complementary/bank_lag"] = step - 1 - self.bank_step
        if self.c.extractor == "self":
            self.add_lessons(step, batch)
        return batch

    # ---- the one-model mode: the actor writes the lessons, and they join its batch
    def add_lessons(self, step: int, batch: Batch) -> None:
        """`complementary.extractor: self`: the actor, given the extractor's prompt, samples `candidates` lessons
        from each chosen episode (distil.py), each measured by its paired gain on the actor's paired episodes; the
        lessons join the batch as single-turn samples whose reward is that gain (meta turn_rewards [gain]) and
        whose group is their episode's (ids P * G + episode: above every game's id), so with credit: grpo each
        lesson's advantage is its gain normalised among the candidates of its episode. The hook (BankHook)
        consolidates the best of each episode into the bank after the update.

        Inferred (the paper's digest says only that the actor may be the extractor "with another prompt"): the
        lessons train in the same update as the episodes, with their own groups; they are sampled by the policy
        that played the step (before its update; the second model samples after the actor's update)."""
        from credo.families.complementary.distil import chosen_episodes, distil_and_pair

        valid = [not s.meta["failed"] for s in batch.samples]
        rows = chosen_episodes(self.seed, step, batch.samples, valid, self.c.extract_per_step)
        if not rows:
            batch.metrics["extractor/episodes"] = 0
            return
        d = distil_and_pair(self, self.backend, self.tokenizer, self.c, seed=self.seed, step=step,
                            samples=batch.samples, problems=batch.problems, rows=rows)
        C = self.c.candidates
        for k, out in enumerate(d.outputs):
            t, j = divmod(k, C)
            gain, m = float(d.gains[t, j]), d.metas[t]
            out.meta = {"turn_rewards": [gain], "failed": False, "experience": None, "game": None,
                        "task_key": m["task_key"], "env_seed": m["env_seed"],
                        "lesson": {"episode": t, "candidate": j, "text": d.lessons[t][j][0], "gain": gain,
                                   "task_key": m["task_key"]}}
            batch.samples.append(out)
            batch.problems.append(Problem(prompt=d.prompts[t], answer="", meta={"env_seed": m["env_seed"]}))
        lesson_groups = self.P * self.G + torch.arange(len(rows)).repeat_interleave(C)
        batch.group_ids = torch.cat([batch.group_ids, lesson_groups])
        batch.metrics.update(d.metrics)
        batch.metrics["extractor/lesson_samples"] = len(d.outputs)

    # ---- paired rollouts for the extractor's reward
    def play(self, env_seeds: list[int], notes: list[str], sample_seeds: list[int]) -> tuple[list[float], list[bool]]:
        """Episodes of `env_seeds` with `notes` shown, sampled with `sample_seeds` at the rollout temperature, in one
        batched call per turn. Returns each episode's return and whether it finished without an env failure."""
        eps, _ = self.run_episodes(env_seeds, temperature=self.temperature, top_p=self.top_p,
                                   sample_seeds=sample_seeds, envs=self.envs_with_notes(notes))
        return [float(sum(e.turn_rewards)) for e in eps], [e.end != "failed" for e in eps]

    # ---- state
    def state_dict(self) -> dict:
        if self.beside is None:
            return {"bank": self.bank.state_dict()}
        # the extractor's work in flight is joined: its bank is saved beside the shown one, installed at next step
        return {"bank": self.bank.state_dict(), "bank_step": self.bank_step, "beside": self.beside.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.bank.load_state_dict(state["bank"])
        if self.beside is not None:
            self.bank_step = int(state.get("bank_step", 0))
            self.beside.load_state_dict(state.get("beside", {}), self.new_bank)

    def close(self) -> None:
        if self.beside is not None:
            self.beside.close()
        super().close()


def complementary_source(ctx, **kwargs) -> ComplementaryRollout:
    """stages.rollout: complementary; its settings are the `complementary:` section and the `env:` section."""
    if kwargs:
        raise ConfigError(f"config key 'stages.rollout_kwargs': the complementary source takes its settings from the "
                          f"complementary: and env: sections, got {sorted(kwargs)}")
    if ctx.recipe is None or not ctx.recipe.env.id:
        raise ConfigError("config key 'stages.rollout' = 'complementary' needs env.id")
    return ComplementaryRollout(ctx.recipe.env, ctx.section, ctx.tokenizer, ctx.backend, seed=ctx.seed,
                                rank=ctx.rank, world=ctx.world, render=ctx.render, **ctx.rollout)
