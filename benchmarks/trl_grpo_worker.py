"""TRL `GRPOTrainer` side of `benchmarks/e2e_throughput.py`; runs inside the TRL virtual environment.

It imports neither credo nor anything credo needs: `e2e_throughput.py` writes a JSON job file (model
directory, prompts in step order, hyperparameters mapped from the credo recipe) and this script trains
on it with TRL, writing one JSON line per optimizer step:

    {"step", "step_s", "tokens", "rollout_s", "reward_s", "prepare_other_s", "loss_fwd_s", "backward_opt_s",
     "response_len", "reward_mean", "threads"}

`step_s` is the time from `on_step_begin` to `on_step_end` (generation, reward, advantages, loss,
backward, clipping, optimizer step; not logging or data loading, which TRL does outside the step).
`tokens` = prompt + completion tokens (completion up to and including EOS, no padding), the same count as
credo's `perf/tokens_per_s`. The breakdown comes from timing `GRPOTrainer` methods in a subclass.

    python trl_grpo_worker.py JOB.json OUT.jsonl
"""

from __future__ import annotations

import json
import sys
import time


def answer_score(response: str, answer: str) -> float:
    """credo's `ArithmeticTask.score`: 1.0 when the response is exactly the integer answer (leading zeros allowed).

    Restated here because this script runs without credo; `e2e_throughput.py` checks that the two agree
    on a set of responses before every run.
    """
    text = response.strip()
    digits = text[1:] if text.startswith("-") else text
    if not digits.isdigit():
        return 0.0
    return 1.0 if int(text) == int(answer) else 0.0


def final_int(text: str) -> int | None:
    """The integer after the last '>' of a text, or None (credo.tasks.skills._final_int)."""
    tail = text.strip().rpartition(">")[2] if ">" in text else None
    return int(tail) if tail and tail.isdigit() else None


def final_int_score(response: str, answer: str) -> float:
    """credo's `LongTailAddTask.score`: 1.0 when the integer after the last '>' of the response is the sum, which is
    the integer after the last '>' of the worked answer. Restated and checked like `answer_score`."""
    got = final_int(response)
    return 1.0 if got is not None and got == final_int(answer) else 0.0


SCORES = {"exact": answer_score, "final_int": final_int_score}
"""The job's `reward` -> the verifier it restates."""


def main(job_path: str, out_path: str) -> int:
    job = json.loads(open(job_path).read())
    import torch

    torch.set_num_threads(job["threads"])
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    rows = job["rows"]
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    # TRL tokenizes plain-text prompts with the tokenizer's defaults; credo with add_special_tokens=False.
    # They must agree or the two frameworks would see different prompts.
    for r in rows[:64]:
        a = tokenizer(text=r["prompt"])["input_ids"]
        b = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        if a != b:
            raise SystemExit(f"prompt {r['prompt']!r} tokenizes to {a} in TRL but {b} in credo")
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)

    score = SCORES[job.get("reward", "exact")]

    def exact_match(completions, answer, **_):
        return [score(c, a) for c, a in zip(completions, answer)]

    timers: dict[str, float] = {}
    counts = {"tokens": 0, "completion_tokens": 0, "completions": 0}

    def timed(key, fn, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[key] = timers.get(key, 0.0) + time.perf_counter() - t0

    class TimedGRPOTrainer(GRPOTrainer):
        def _generate_single_turn(self, prompt_ids, *args, **kwargs):
            completion_ids, logprobs = timed("rollout_s", super()._generate_single_turn, prompt_ids, *args, **kwargs)
            n_completion = sum(len(c) for c in completion_ids)
            # prompt_ids holds one entry per completion (each prompt repeated num_generations times)
            counts["tokens"] += sum(len(p) for p in prompt_ids) + n_completion
            counts["completion_tokens"] += n_completion
            counts["completions"] += len(completion_ids)
            return completion_ids, logprobs

        def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
            rewards = timed("reward_s", super()._calculate_rewards, inputs, prompts, completions, completion_ids_list)
            timers["reward_sum"] = timers.get("reward_sum", 0.0) + float(rewards.sum())
            return rewards

        def _prepare_inputs(self, generation_batch):
            return timed("prepare_s", super()._prepare_inputs, generation_batch)

        def compute_loss(self, *args, **kwargs):
            return timed("loss_fwd_s", super().compute_loss, *args, **kwargs)

    out = open(out_path, "w")

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            timers.clear()
            counts.update(tokens=0, completion_tokens=0, completions=0)
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.perf_counter() - self.t0
            g = lambda k: timers.get(k, 0.0)  # noqa: E731
            n = max(counts["completions"], 1)
            row = {"step": state.global_step, "step_s": step_s, "tokens": counts["tokens"],
                   "rollout_s": g("rollout_s"), "reward_s": g("reward_s"),
                   "prepare_other_s": g("prepare_s") - g("rollout_s") - g("reward_s"),
                   "loss_fwd_s": g("loss_fwd_s"), "backward_opt_s": step_s - g("prepare_s") - g("loss_fwd_s"),
                   "response_len": counts["completion_tokens"] / n, "reward_mean": g("reward_sum") / n,
                   "threads": torch.get_num_threads()}
            out.write(json.dumps(row) + "\n")
            out.flush()

    cfg = job["config"]
    args = GRPOConfig(
        output_dir=job["output_dir"], max_steps=job["steps"], seed=job["seed"], data_seed=job["seed"],
        per_device_train_batch_size=cfg["per_device_train_batch_size"],
        gradient_accumulation_steps=cfg["gradient_accumulation_steps"],
        steps_per_generation=cfg["gradient_accumulation_steps"], num_generations=cfg["num_generations"],
        max_completion_length=cfg["max_completion_length"], temperature=cfg["temperature"], top_p=cfg["top_p"],
        top_k=0, learning_rate=cfg["learning_rate"], warmup_steps=cfg["warmup_steps"],
        lr_scheduler_type="constant_with_warmup" if cfg["warmup_steps"] else "constant",
        weight_decay=cfg["weight_decay"], adam_beta1=cfg["adam_beta1"], adam_beta2=cfg["adam_beta2"],
        max_grad_norm=cfg["max_grad_norm"], beta=cfg["beta"], num_iterations=1, epsilon=cfg["epsilon"],
        epsilon_high=cfg["epsilon_high"], loss_type=cfg["loss_type"], scale_rewards=cfg["scale_rewards"],
        entropy_coef=cfg["entropy_coef"], mask_truncated_completions=cfg["mask_truncated_completions"],
        shuffle_dataset=False,  # the job's rows are already in credo's per-step prompt order
        use_vllm=False, use_cpu=True, bf16=False, fp16=False, gradient_checkpointing=False,
        report_to=[], save_strategy="no", logging_steps=job["steps"], disable_tqdm=True,
        log_completions=False, dataloader_num_workers=0,
    )
    dataset = Dataset.from_list(rows)
    trainer = TimedGRPOTrainer(model=model, reward_funcs=exact_match, args=args, train_dataset=dataset,
                               processing_class=tokenizer, callbacks=[StepTimer()])
    trainer.train()
    out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
