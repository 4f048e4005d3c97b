"""Held-out evaluation of the current policy on the task's eval split, sharded over ranks.

With a verifier (`task.score`), the score is accuracy (`eval/accuracy`). A file or hf task has none: given
the run's weighted reward functions (`reward_fn`, a `WeightedRewards`), the score is their mean weighted
reward on the held-out prompts (`eval/reward_mean`).
"""

from __future__ import annotations

import torch

from credo.distributed.engine import all_reduce_sum
from credo.tasks.render import encode_prompts, plain_prompt
from credo.train.rollout import step_seed


class Evaluator:
    """Greedy accuracy, or the mean over `samples` draws per problem at `temperature` with fixed seeds
    (the same draws at every evaluation, so the curve moves only with the policy).

    Problems are dealt to ranks round-robin; the seed of draw s of problem j is
    `step_seed(seed, -1, j * samples + s)` whatever the number of processes, so 1 and N processes ask
    for the same (problem, seed) draws. With vLLM, which seeds each request, the samples and so the
    accuracy are then the same; the hf backend draws one RNG stream per generate call (derived from all
    of its seeds), so there a rank's samples also depend on which problems share its call, and 1 and N
    processes give the same estimator over different draws.
    """

    def __init__(self, task, tokenizer, source, *, seed: int, temperature: float, samples: int, rank: int = 0,
                 world: int = 1, render=plain_prompt, reward_fn=None):
        self.task, self.tokenizer, self.source = task, tokenizer, source
        self.seed, self.temperature, self.samples = seed, temperature, samples
        self.rank, self.world, self.render = rank, world, render
        self.reward_fn = reward_fn if getattr(task, "score", None) is None else None
        self.metric = "eval/accuracy" if self.reward_fn is None else "eval/reward_mean"
        """The key the score is logged under."""
        self.last_samples: tuple = ([], [], [])
        """This rank's (prompts, completions, scores) of the last evaluation, for `Tracker.log_samples`."""

    def __call__(self) -> float:
        every = self.task.eval_problems()
        index = range(len(every))[self.rank::self.world]  # this rank's problems, by their global index
        problems = [every[j] for j in index]
        k = self.samples
        prompts = [ids for ids in encode_prompts(self.tokenizer, self.render, problems) for _ in range(k)]
        greedy = self.temperature == 0
        # the seed of sample s of problem j is a function of (j, s) alone, so the draws (and the accuracy) do
        # not depend on how many processes share the problems; with one process it is step_seed(.., i), i = j*k+s
        seeds = None if greedy else [step_seed(self.seed, -1, j * k + s) for j in index for s in range(k)]
        samples = self.source.generate(prompts, temperature=1.0 if greedy else self.temperature, seeds=seeds)
        texts = self.tokenizer.batch_decode([s.response_ids for s in samples], skip_special_tokens=True)
        prompts = [problems[i // k].prompt for i in range(len(texts))]
        if self.reward_fn is not None:
            return self._reward_mean(texts, [list(s.response_ids) for s in samples], [p for p in problems for _ in range(k)])
        scores = []
        for i, text in enumerate(texts):
            try:
                scores.append(float(self.task.score(text, problems[i // k])))
            except Exception:  # noqa: BLE001 - a verifier crash on one answer scores it 0
                scores.append(0.0)
        self.last_samples = (prompts, texts, scores)
        tot = all_reduce_sum(torch.tensor([sum(scores), float(len(samples))], dtype=torch.float64))
        return float(tot[0] / tot[1])

    def _reward_mean(self, texts: list[str], ids: list[list[int]], problems: list) -> float:
        """Mean weighted reward over all ranks' samples; a call that raises scores its sample 0, as above."""
        scores = []
        for i in range(len(texts)):  # one call per sample: a failure costs that sample only
            try:
                scores.append(self.reward_fn(texts[i:i + 1], problems[i:i + 1], ids[i:i + 1]).finish(1)[0])
            except Exception:  # noqa: BLE001
                scores.append(0.0)
        self.last_samples = ([p.prompt for p in problems], texts, scores)
        total = sum(scores)
        tot = all_reduce_sum(torch.tensor([total, float(len(texts))], dtype=torch.float64))
        return float(tot[0] / tot[1])
