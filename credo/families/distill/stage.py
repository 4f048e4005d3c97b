"""The `distill` advantage stage: the outcome advantage, then the teacher's score of every sampled token.

For each loss token, with pi_student the sampler's log-prob of the token (what Thinking Machines use) and
pi_teacher the teacher's:

    d_t = log pi_student(y_t) - log pi_teacher(y_t)
    reward form (distill.weight > 0):   advantages = (1 - weight) * outcome + weight * distill_advantages(d, discount)
    loss-term form (distill.loss_coef): batch.target_terms['distill_kl'] = (loss_coef, log pi_teacher), which the
                                        objective adds as loss_coef * aggregate((log pi_theta - log pi_teacher)^2 / 2)

and logs distill/reverse_kl (the mean of d_t over the loss tokens of all ranks: the per-token reverse-KL estimate),
distill/teacher_logprob, distill/student_logprob (their means) and perf/distill_teacher_s (the teacher's forward).
"""

from __future__ import annotations

import time

import torch

from credo import algos
from credo.distributed.engine import all_reduce_sum, device
from credo.families.distill.teacher import TeacherScorer, teacher_folder
from credo.train.batch import Batch

TARGET = "distill_kl"
"""The objective's term name (`Batch.target_terms`), logged as train/distill_kl."""


class DistillAdvantage:
    """Wraps the outcome advantage stage `default`; see the module docstring."""

    def __init__(self, default, teacher: TeacherScorer, *, weight: float, discount: float, loss_coef: float):
        self.default, self.teacher = default, teacher
        self.weight, self.discount, self.loss_coef = weight, discount, loss_coef

    def __call__(self, batch: Batch) -> None:
        self.default(batch)
        m = batch.loss_mask
        if not all(s.rollout_log_probs for s in batch.samples):
            raise ValueError("distill: a sample has no sampler log-probs (Sample.rollout_log_probs); the reward "
                             "form's log-ratio needs the student's log-prob of each sampled token")
        t0 = time.perf_counter()
        teacher = self.teacher(batch.input_ids, batch.attention_mask, m)
        seconds = time.perf_counter() - t0
        student = batch.rollout_log_probs
        if self.weight > 0:
            adv = algos.distill_advantages(student, teacher, m, discount=self.discount)
            batch.advantages = algos.mix_advantages(batch.advantages, adv.to(batch.advantages.dtype), self.weight) * m
        if self.loss_coef > 0:
            batch.target_terms[TARGET] = (self.loss_coef, teacher)
        batch.metrics.update(token_means(student, teacher, m))
        batch.metrics["perf/distill_teacher_s"] = seconds

    def state_dict(self) -> dict:
        return self.default.state_dict() if hasattr(self.default, "state_dict") else {}

    def load_state_dict(self, state: dict) -> None:
        if hasattr(self.default, "load_state_dict"):
            self.default.load_state_dict(state)

    def close(self) -> None:
        """Stop the teacher's process (distill.placement: worker); the Ray actors stop with the run's cluster."""
        close = getattr(self.teacher, "close", None)
        if close is not None:
            close()


def token_means(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """distill/* metrics: means over the loss tokens of every rank (0 when there are none)."""
    d = algos.reverse_kl_log_ratio(student, teacher, mask)
    sums = torch.stack([d.sum(), torch.where(mask, teacher, 0.0).sum(), torch.where(mask, student, 0.0).sum(),
                        mask.sum().to(d.dtype)]).double()
    kl, t, s, n = all_reduce_sum(sums.cpu()).tolist()
    n = max(n, 1.0)
    return {"distill/reverse_kl": kl / n, "distill/teacher_logprob": t / n, "distill/student_logprob": s / n}


def make_distill(ctx):
    """The stage factory: the teacher (its folder made by the family's warm-up, cached) where distill.placement
    says: on the trainer, in its own process on this host, or on the run's Ray cluster (cluster.teacher)."""
    r, d = ctx.recipe, ctx.section
    if ctx.default is None:
        from credo.errors import ConfigError

        raise ConfigError(f"config key 'algo.advantage' = '{r.algo.advantage}' is not an outcome estimator: "
                          "distill.enabled mixes its advantage with the outcome advantage's")
    folder, _ = teacher_folder(r, ctx.task, log=lambda m: None)
    scorer = make_scorer(d.placement, folder, r, cluster=ctx.cluster)
    return DistillAdvantage(ctx.default, scorer, weight=d.weight, discount=d.discount, loss_coef=d.loss_coef)


def make_scorer(placement: str, folder: str, r, *, cluster=None):
    """The teacher's scorer at `placement`; each loads `folder` in model.dtype and scores in row chunks of
    algo.micro_batch_size, so all three give the same log-probs on the same kind of device (the worker and the actors
    use the trainer's thread count unless cluster.teacher.threads says otherwise)."""
    rows, chunk = r.algo.micro_batch_size, r.algo.logprob_chunk_size
    if placement == "worker":
        from credo.families.distill.worker import TeacherProcess

        return TeacherProcess(folder, dtype=r.model.dtype, rows=rows, chunk_size=chunk, device=device(),
                              threads=torch.get_num_threads())
    if placement == "ray":
        from credo.distributed.ray.teacher import RayTeacher

        if cluster is None:  # the refusal rows keep this from `credo check`; a hand-built context may still get here
            from credo.errors import ConfigError

            raise ConfigError("config key 'distill.placement' = 'ray' needs cluster.engine: ray (the run's Ray "
                              "cluster)")
        cluster.check_role("teacher")  # a ConfigError naming the role, before any teacher actor starts
        return cluster.track(RayTeacher.from_cluster(cluster.cfg, folder, dtype=r.model.dtype, rows=rows,
                                                     chunk_size=chunk, threads=torch.get_num_threads()))
    from credo.models import check_vocab, load_causal_lm, load_tokenizer

    model = load_causal_lm(folder, r.model.dtype)
    check_vocab(model, load_tokenizer(folder), folder)
    model = model.to(device()).eval().requires_grad_(False)
    return TeacherScorer(model, rows=rows, chunk_size=chunk, device=device())
