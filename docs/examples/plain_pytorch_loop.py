"""A plain PyTorch RL loop using credo.algos only (no trainer, no transformers).

Toy bandit: for prompt p the policy writes L tokens; the reward is the fraction of tokens equal
to the prompt's target token. Policy: logits from embeddings of (prompt, previous token).
GRPO advantages (group = the G samples of one prompt), PPO clipped loss, entropy bonus.
Run: python docs/examples/plain_pytorch_loop.py
"""

import torch

from credo.algos import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, aggregate, entropy_from_logits

P, G, L, V = 8, 4, 6, 8  # prompts, samples per prompt, tokens per answer, vocabulary


class Policy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.prompt, self.prev = torch.nn.Embedding(P, V), torch.nn.Embedding(V + 1, V)

    def forward(self, prompts, tokens):  # tokens [B, L] -> logits [B, L, V] (teacher forcing)
        prev = torch.cat([torch.full_like(tokens[:, :1], V), tokens[:, :-1]], dim=1)  # V = BOS
        return self.prompt(prompts)[:, None] + self.prev(prev)


def main(steps=30, seed=0):
    torch.manual_seed(seed)
    policy, target = Policy(), torch.randint(0, V, (P,))
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.1)
    prompts = torch.arange(P).repeat_interleave(G)  # [B], B = P * G; also the group ids
    mask, history = torch.ones(P * G, L, dtype=torch.bool), []
    for _ in range(steps):
        with torch.no_grad():  # rollout: sample token by token
            tokens = torch.zeros(P * G, L, dtype=torch.long)
            for t in range(L):
                tokens[:, t] = torch.distributions.Categorical(logits=policy(prompts, tokens)[:, t]).sample()
            old_log_probs = torch.log_softmax(policy(prompts, tokens), -1).gather(-1, tokens[..., None])[..., 0]
        rewards = (tokens == target[prompts, None]).float().mean(-1)
        advantages = ADVANTAGE_ESTIMATORS["grpo"](rewards, prompts, mask)
        for _ in range(2):  # two PPO epochs on the same rollout
            logits = policy(prompts, tokens)
            log_probs = torch.log_softmax(logits, -1).gather(-1, tokens[..., None])[..., 0]
            loss, metrics = POLICY_LOSSES["ppo"](log_probs, old_log_probs, advantages, mask, clip_high=0.28)
            loss = loss - 1e-3 * aggregate(entropy_from_logits(logits), mask, "token-mean")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        history.append(rewards.mean().item())
    return history


if __name__ == "__main__":
    for step, reward in enumerate(main()):
        print(f"step {step:2d}  mean reward {reward:.3f}")
