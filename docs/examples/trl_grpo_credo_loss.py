"""TRL's GRPOTrainer with a credo loss: your model, your data set, your TRL reward functions, unchanged.

Only the trainer class changes (`CredoGRPOTrainer`) and three arguments pick the loss. Without a model
folder it builds credo's built-in tiny model, so it runs offline on a CPU in seconds.

Run: python docs/examples/trl_grpo_credo_loss.py [MODEL_DIR] [--steps N]   (needs: pip install trl datasets)
"""

import argparse

from datasets import Dataset
from trl import GRPOConfig

from credo.integrations.trl import CredoGRPOTrainer


def exact_answer(completions, answer, **kwargs):
    """A TRL reward function: 1.0 when the completion starts with the answer column."""
    return [1.0 if c.strip().startswith(a) else 0.0 for c, a in zip(completions, answer)]


def starts_with_digit(completions, **kwargs):
    return [0.1 if c[:1].isdigit() else 0.0 for c in completions]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?", default=None, help="a Hugging Face model folder (default: credo's tiny model)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--output-dir", default="runs/trl-credo")
    args = ap.parse_args(argv)
    if args.model is None:
        from credo.config import TinyModelConfig
        from credo.models import build_tiny_model

        args.model = str(build_tiny_model(TinyModelConfig(num_layers=1, hidden_size=64, num_heads=2, num_kv_heads=1)))
    data = Dataset.from_list([{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)])
    trainer = CredoGRPOTrainer(
        model=args.model,
        reward_funcs=[exact_answer, starts_with_digit],
        args=GRPOConfig(output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=8,
                        num_generations=4, max_completion_length=4, learning_rate=1e-3, reward_weights=[1.0, 1.0],
                        logging_steps=1, report_to=[], save_strategy="no", use_cpu=True, bf16=False),
        train_dataset=data,
        policy_loss="cispo", loss_kwargs={"clip_high": 4.0}, agg_mode="seq-mean-token-sum-norm",  # the credo loss
    )
    trainer.train()
    return trainer


if __name__ == "__main__":
    main()
