"""The multi-domain held-out evaluation (arXiv 2601.03111: one sample, scored on many disciplines).

Every evaluation discipline's held-out problems are answered in one generate call, `run.eval_samples` times each at
`run.eval_temperature` (greedy at 0; at most polymath.eval_max_new_tokens tokens when set), and scored by that
discipline's verifier:

    eval/<d>         = mean score over discipline d's held-out problems and samples
    eval/accuracy    = the mean of eval/<d> over the disciplines (each discipline weighs the same, whatever its size)

Problems are dealt to ranks round-robin by their global index j (disciplines in order, then their problems); the
seed of sample s of problem j is step_seed(run seed, -1, j * samples + s), the same draws at every evaluation, so
the curves move only with the policy (as the core evaluator's).
"""

from __future__ import annotations

import torch

from credo.distributed.engine import all_reduce_sum
from credo.tasks.render import encode_prompts, plain_prompt
from credo.train.rollout import step_seed


class MultiDomainEvaluator:
    """eval/accuracy (the macro mean) from `__call__`; eval/<discipline> in `extra_metrics` after each call."""

    metric = "eval/accuracy"

    def __init__(self, task, disciplines: list[str], tokenizer, source, *, seed: int, temperature: float,
                 samples: int, rank: int = 0, world: int = 1, render=plain_prompt, max_new_tokens: int = 0):
        self.task, self.disciplines, self.tokenizer, self.source = task, list(disciplines), tokenizer, source
        self.seed, self.temperature, self.samples, self.rank, self.world = seed, temperature, samples, rank, world
        self.render, self.max_new_tokens = render, max_new_tokens
        self.problems = [(d, p) for d in self.disciplines for p in task.discipline_eval(d)]
        """Every held-out problem, (discipline, problem), in global index order."""
        self.extra_metrics: dict[str, float] = {}
        """eval/<discipline> of the last evaluation (the trainer logs them beside eval/accuracy)."""
        self.last_samples: tuple = ([], [], [])
        """This rank's (prompts, completions, scores) of the last evaluation."""

    def __call__(self) -> float:
        index = list(range(len(self.problems)))[self.rank::self.world]
        k, greedy = self.samples, self.temperature == 0
        mine = [self.problems[j][1] for j in index]
        prompts = [ids for ids in encode_prompts(self.tokenizer, self.render, mine) for _ in range(k)]
        seeds = None if greedy else [step_seed(self.seed, -1, j * k + s) for j in index for s in range(k)]
        out = self._generate(prompts, 1.0 if greedy else self.temperature, seeds)
        texts = self.tokenizer.batch_decode([s.response_ids for s in out], skip_special_tokens=True)
        sums = {d: 0.0 for d in self.disciplines}
        counts = {d: 0.0 for d in self.disciplines}
        scores = []
        for i, text in enumerate(texts):
            d, problem = self.problems[index[i // k]]
            try:
                score = float(self.task.score(text, problem))
            except Exception:  # noqa: BLE001 - a verifier crash on one answer scores it 0, as the core evaluator
                score = 0.0
            scores.append(score)
            sums[d] += score
            counts[d] += 1
        self.last_samples = ([mine[i // k].prompt for i in range(len(texts))], texts, scores)
        tot = all_reduce_sum(torch.tensor([sums[d] for d in self.disciplines] + [counts[d] for d in self.disciplines],
                                          dtype=torch.float64)).tolist()
        n = len(self.disciplines)
        acc = {d: tot[i] / tot[n + i] if tot[n + i] else float("nan") for i, d in enumerate(self.disciplines)}
        self.extra_metrics = {f"eval/{d}": v for d, v in acc.items()}
        present = [v for v in acc.values() if v == v]
        return sum(present) / len(present) if present else float("nan")

    def _generate(self, prompts, temperature: float, seeds):
        """The source's sampling, at this evaluator's own length cap when it has one (through the source's rollout
        engine, `source.backend`, as the source's own `generate` calls it)."""
        backend = getattr(self.source, "backend", None)
        if not self.max_new_tokens or backend is None:
            return self.source.generate(prompts, temperature=temperature, seeds=seeds)
        return backend.generate(prompts, max_new_tokens=self.max_new_tokens, temperature=temperature, top_p=1.0,
                                seeds=seeds)
