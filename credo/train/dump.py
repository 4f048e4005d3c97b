"""Rollout dumps: `rollouts/step_<N>.jsonl`, one row per sample, for looking at what a run trains on.

A row holds the prompt and response text, the token ids and response mask, the reward (and whether its
call succeeded), the per-token advantages (aligned with the response ids), the sampler's log-probs, the policy version
(and, under partial rollout, `policy_versions`: each token's), `stream_index` (an asynchronous schedule's place of
the sample's group in the prompt stream; None otherwise), and the sample's
`meta` (per-turn fields of multi-turn sources). Each rank writes its own rows to its own file part
(`step_<N>.rank<r>.jsonl` beside rank 0's `step_<N>.jsonl`), so no gather is needed.

A sample whose source records its turns (`meta["turns"]`: role-marked dicts, as the multi-turn family writes them)
gets them as `turns` and rendered as `transcript`, one line per turn (continuation lines indented), so a multi-turn
dump reads as a conversation rather than as `response`, the agent's and the env's tokens joined:

    [env] You are shopping for a red wool shoe ...
    [agent 1] <search>shoe red wool</search>
        -> search(shoe red wool)
    [tool 1, reward +0.000] 17 red wool shoe $55 | 23 ...
    [agent 2] \boxed{17}
        -> answer(17)
    [env 2, reward +1.000, end: terminated] you bought 17
"""

from __future__ import annotations

import json
from pathlib import Path

from credo.train.batch import Batch


def dump_rollouts(batch: Batch, tokenizer, out_dir: Path, *, rank: int = 0) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / (f"step_{batch.step}.jsonl" if rank == 0 else f"step_{batch.step}.rank{rank}.jsonl")
    prompts = tokenizer.batch_decode([s.prompt_ids for s in batch.samples], skip_special_tokens=False)
    responses = tokenizer.batch_decode([s.response_ids for s in batch.samples], skip_special_tokens=False)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        for i, s in enumerate(batch.samples):
            p, n = len(s.prompt_ids), len(s.response_ids)
            token_adv = batch.advantages[i, p - 1:p - 1 + n] if batch.advantages is not None else None
            row = {
                "step": batch.step, "index": i, "group_id": int(batch.group_ids[i]),
                "prompt": prompts[i], "response": responses[i],
                "prompt_ids": s.prompt_ids, "response_ids": s.response_ids, "response_mask": s.response_mask,
                "reward": float(batch.rewards[i]), "reward_valid": bool(batch.valid[i]), "finished": s.finished,
                "trained": bool(batch.loss_mask[i].any()),
                "advantages": None if token_adv is None else [round(float(a), 6) for a in token_adv],
                "rollout_log_probs": s.rollout_log_probs,
                "policy_version": s.policy_version,
                # per token, the version that drew it (partial rollout); None: every token has policy_version
                "policy_versions": s.policy_versions,
                "stream_index": s.meta.get("stream_index") if isinstance(s.meta, dict) else None,
                "answer": getattr(batch.problems[i], "answer", None),
                "meta": s.meta,
            }
            if isinstance(s.meta, dict) and isinstance(s.meta.get("turns"), list):
                row["meta"] = {k: v for k, v in s.meta.items() if k != "turns"}
                row["turns"] = s.meta["turns"]
                row["transcript"] = render_transcript(s.meta["turns"])
            f.write(json.dumps(row, default=str) + "\n")
    tmp.replace(path)
    return path


def render_transcript(turns: list[dict]) -> str:
    """Turns ({role, text, turn?, tool_call?, reward?, end?}) as text: `[role turn, reward r, end: e] text`, then
    `    -> name(arguments)` under a turn that calls a tool; a text's further lines are indented."""
    lines = []
    for t in turns:
        head = t["role"] + (f" {t['turn']}" if "turn" in t else "")
        if "reward" in t:
            head += f", reward {float(t['reward']):+.3f}"
        if t.get("end"):
            head += f", end: {t['end']}"
        text = str(t.get("text", "")).replace("\n", "\n    ")
        lines.append(f"[{head}] {text}".rstrip())
        call = t.get("tool_call")
        if call:
            lines.append(f"    -> {call['name']}({call['arguments']})")
    return "\n".join(lines)
