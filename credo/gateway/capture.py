"""Exact token capture: every call's tokens recorded under its episode, and trajectories assembled from them.

An agent talks text (chat messages); the policy is trained on tokens. Re-tokenizing the agent's text history
is how other frameworks lose exactness: a sampled answer whose tokens are not the tokenizer's canonical split of
its text comes back as different ids, and the importance ratio of those tokens is then taken against log-probs of
tokens the model never sampled. The gateway does not re-tokenize a history it has seen. It keeps, per episode,
*segments*: token sequences built only from

- the first prompt of the conversation (tokenized once; mask 0),
- the tokens the model sampled in each call (mask 1, with their behaviour log-probs), and
- the text the chat template added between two calls (closing the assistant turn, tool outputs, user turns,
  the next generation prompt; tokenized on its own; mask 0),

together with the text those tokens stand for (the prompt text, then each sample decoded with its special tokens,
then each template delta). A segment's *checkpoints* are its root prompt and the end of each sampled turn. A new
call renders its messages to text T and takes the longest checkpoint of the episode's segments that T extends:

1. **Continuation** (a segment's latest checkpoint): the prompt sent to the model is the segment's own ids plus
   the tokenized rest of T, and the new sample extends the segment. The model sees exactly the tokens it sampled.
2. **Fork** (an earlier checkpoint k, and T is exactly the prompt of the segment's turn k+1, i.e. a retried call,
   or T leaves the segment before turn k+1's answer, i.e. a new branch after turn k, a different tool output):
   a new segment copies the prefix up to checkpoint k and continues from there. Every echoed answer is as sampled,
   so this is not drift; `gateway/forks` counts it.
3. **Drift** (an earlier checkpoint k, and T goes past turn k+1's prompt with something else where the model's
   sampled answer was: a template that drops earlier reasoning, a client that strips whitespace or edits an
   answer, a stop string that cut inside a token). **Rule: split.** The segment is closed as it stands (every
   token in it is still exactly what was sampled and seen) and a new segment starts whose prompt is T tokenized
   as a plain server would (all mask 0). Nothing sampled before the drift point is carried into the new segment
   with mask 1, so no token is ever trained on that the model did not sample in that context.
   `gateway/retokenization_drift` counts it, and the new segment records where T and the old text first differ
   (`meta["drift_at"]`, a character offset of T).
4. **New conversation** (T extends no checkpoint: a sub-agent, a summarizer call): a new segment.

Choices 2..n of a call with `n > 1` are segments of their own (forks of the pre-call state). A trajectory is one
segment, as a `credo.distributed.rollout.Sample`: prompt = its first prompt, response = everything after, the
turn spans in `meta["turns"]` (the runs of mask 1: IPA's chunks).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from credo.distributed.rollout import Sample


@dataclass
class CallRecord:
    """One chat-completions call as sampled: what the model was given and what it produced."""

    episode: str
    index: int
    """The call's position among its episode's calls (0-based)."""
    prompt_ids: list[int]
    """The token ids the model was conditioned on (exactly those passed to the backend)."""
    choices: list[dict]
    """Per choice: `response_ids` (sampled, after any stop cut), `log_probs` (behaviour), `finish_reason`."""
    policy_version: int
    kind: str
    """How the prompt was built: continuation, fork, drift or new (see the module docstring)."""
    segments: list[int]
    """The segment each choice went into (indices into the episode's segments)."""


@dataclass
class Segment:
    root_text: str
    root_ids: list[int]
    text: str
    ids: list[int]
    """The whole sequence: root prompt, then response tokens."""
    mask: list[int]
    """Per token after the root: 1 sampled, 0 template / tool output."""
    log_probs: list[float]
    versions: list[int] = field(default_factory=list)
    turns: list[tuple[int, int]] = field(default_factory=list)
    """[start, end) of each sampled turn, as offsets into the response (after the root)."""
    checkpoints: list[tuple[int, int]] = field(default_factory=list)
    """(len(text), len(ids)) of the root prompt, then after each sampled turn, in order."""
    prompt_ends: list[int] = field(default_factory=list)
    """len(text) of the prompt each sampled turn was given (just before the turn)."""
    calls: list[int] = field(default_factory=list)
    finished: bool = False
    opened_by: str = "new"
    drift_at: int | None = None

    def truncated(self, k: int) -> "Segment":
        """A copy of the segment as it stood at checkpoint k (its root prompt and first k sampled turns)."""
        text_len, ids_len = self.checkpoints[k]
        n_resp = ids_len - len(self.root_ids)
        return Segment(self.root_text, list(self.root_ids), self.text[:text_len], self.ids[:ids_len],
                       self.mask[:n_resp], self.log_probs[:n_resp], self.versions[:k], self.turns[:k],
                       self.checkpoints[:k + 1], self.prompt_ends[:k], self.calls[:k], opened_by="fork")

    def to_sample(self, episode: str, index: int) -> Sample:
        n = len(self.root_ids)
        return Sample(list(self.root_ids), self.ids[n:], list(self.mask), list(self.log_probs), self.finished,
                      min(self.versions) if self.versions else 0,
                      meta={"episode": episode, "segment": index, "turns": list(self.turns), "calls": list(self.calls),
                            "policy_versions": list(self.versions), "opened_by": self.opened_by,
                            "drift_at": self.drift_at})


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Plan:
    """Where a new call's prompt comes from: the segment (or None) it extends, and the prompt ids."""

    kind: str
    prompt_ids: list[int]
    base: Segment
    """The pre-call state the samples extend (a fresh root segment for new / drift)."""
    target: int | None
    """Index of the segment extended in place by choice 0 (continuation); None when choice 0 opens a new one."""


class EpisodeStore:
    """The calls and segments of every episode, and the gateway's counters. `lock` is held by the server around
    plan, sampling and record (credo.gateway.server), and by the readers below, so a reader never sees half a call."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.calls: dict[str, list[CallRecord]] = {}
        self.segments: dict[str, list[Segment]] = {}
        self.counters = {"gateway/requests": 0, "gateway/retokenization_drift": 0, "gateway/forks": 0,
                         "gateway/errors": 0, "gateway/agent_failures": 0, "gateway/agent_timeouts": 0}
        self.closed: set[str] = set()
        """Episodes that take no more calls (their agent timed out): the server refuses them with 409."""
        self.call_rewards: dict[str, dict[int, float]] = {}
        """episode -> call index -> the per-turn rewards reported for it (`POST /credo/reward`), summed."""
        self.lock = threading.Lock()
        self._count_lock = threading.Lock()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        """The text a sample stands for in a history: special tokens kept (the EOS that closed the turn)."""
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def plan(self, episode: str, text: str) -> Plan:
        """How to build the prompt of a call whose rendered messages are `text` (rules 1-4 of the docstring)."""
        best = None  # (text length matched, segment index, checkpoint index)
        for si, seg in enumerate(self.segments.get(episode, [])):
            for k, (text_len, _) in enumerate(seg.checkpoints):
                if (best is None or text_len > best[0]) and text.startswith(seg.text[:text_len]):
                    best = (text_len, si, k)
        if best is not None:
            _, si, k = best
            seg = self.segments[episode][si]
            if k == len(seg.checkpoints) - 1:
                return Plan("continuation", seg.ids + self.encode(text[len(seg.text):]), seg, si)
            next_prompt = seg.text[:seg.prompt_ends[k]]
            if text == next_prompt or not text.startswith(next_prompt):  # a retry, or a new branch after turn k
                base = seg.truncated(k)
                return Plan("fork", base.ids + self.encode(text[len(base.text):]), base, None)
            # T holds, where the model answered in turn k+1, something other than what it sampled: drift
            ids = self.encode(text)
            root = Segment(text, ids, text, list(ids), [], [], checkpoints=[(len(text), len(ids))], opened_by="drift",
                           drift_at=_common_prefix(text, seg.text))
            return Plan("drift", ids, root, None)
        ids = self.encode(text)
        return Plan("new", ids, Segment(text, ids, text, list(ids), [], [], checkpoints=[(len(text), len(ids))]), None)

    def record(self, episode: str, text: str, plan: Plan, choices: list[dict], version: int) -> CallRecord:
        """Store a sampled call: choice 0 extends the planned segment, choices 1.. open forks of the pre-call state.
        `text` is the rendered prompt; each choice holds `response_ids`, `log_probs`, `finish_reason`."""
        segs = self.segments.setdefault(episode, [])
        calls = self.calls.setdefault(episode, [])
        index = len(calls)
        delta_text = text[len(plan.base.text):]
        delta_ids = plan.prompt_ids[len(plan.base.ids):]
        base = plan.base
        where = []
        for c, choice in enumerate(choices):  # each choice extends its own copy of the pre-call state
            seg = Segment(base.root_text, list(base.root_ids), base.text, list(base.ids), list(base.mask),
                          list(base.log_probs), list(base.versions), list(base.turns), list(base.checkpoints),
                          list(base.prompt_ends), list(base.calls), opened_by=base.opened_by if c == 0 else "choice",
                          drift_at=base.drift_at if c == 0 else None)
            self._extend(seg, delta_text, delta_ids, choice, version, index)
            if c == 0 and plan.target is not None:
                segs[plan.target] = seg
                where.append(plan.target)
            else:
                segs.append(seg)
                where.append(len(segs) - 1)
        if plan.kind == "drift":
            self.counters["gateway/retokenization_drift"] += 1
        elif plan.kind == "fork":
            self.counters["gateway/forks"] += 1
        rec = CallRecord(episode, index, list(plan.prompt_ids), choices, version, plan.kind, where)
        calls.append(rec)
        return rec

    def _extend(self, seg: Segment, delta_text: str, delta_ids: list[int], choice: dict, version: int,
                call: int) -> None:
        """Append the template's delta (mask 0) and one sampled answer (mask 1) to `seg`."""
        resp = list(choice["response_ids"])
        seg.prompt_ends.append(len(seg.text) + len(delta_text))
        seg.text += delta_text + self.decode(resp)
        seg.ids += delta_ids + resp
        seg.mask += [0] * len(delta_ids) + [1] * len(resp)
        seg.log_probs += [0.0] * len(delta_ids) + [float(x) for x in choice["log_probs"]]
        start = len(seg.mask) - len(resp)
        seg.turns.append((start, len(seg.mask)))
        seg.versions.append(version)
        seg.calls.append(call)
        seg.checkpoints.append((len(seg.text), len(seg.ids)))
        seg.finished = choice["finish_reason"] == "stop"

    def trajectories(self, episode: str) -> list[Sample]:
        """The episode's segments as Samples (mask 1 = sampled, log-probs the behaviour's, 0.0 under mask 0)."""
        with self.lock:
            return [seg.to_sample(episode, i) for i, seg in enumerate(self.segments.get(episode, []))]

    def episode_calls(self, episode: str) -> list[CallRecord]:
        with self.lock:
            return list(self.calls.get(episode, []))

    def count(self, name: str, n: int = 1) -> None:
        """Add to a counter (its own lock: the server's event loop counts refusals while a call samples)."""
        with self._count_lock:
            self.counters[name] = self.counters.get(name, 0) + n

    def close(self, episode: str) -> None:
        """Refuse the episode's further calls (an abandoned agent's), from its next call on."""
        self.closed.add(episode)  # a set add is atomic; not under `lock`, which a call holds while it samples

    def add_call_reward(self, episode: str, reward: float, call: int | None = None) -> int:
        """Add `reward` to call `call` of `episode` (None: its latest call); returns the call's index. A ValueError
        says why it cannot (no such call yet, an episode that is over)."""
        with self.lock:
            if episode in self.closed:
                raise ValueError(f"episode {episode!r} is over (its agent ran past its timeout)")
            n = len(self.calls.get(episode, []))
            if n == 0:
                raise ValueError(f"episode {episode!r} has made no call yet: a per-turn reward names a call it made")
            index = n - 1 if call is None else call
            if not 0 <= index < n:
                raise ValueError(f"'call' = {call}: episode {episode!r} has made calls 0..{n - 1}")
            rewards = self.call_rewards.setdefault(episode, {})
            rewards[index] = rewards.get(index, 0.0) + reward
            return index

    def take_call_rewards(self, episode: str) -> dict[int, float]:
        """The per-turn rewards reported for `episode`, and forget them."""
        with self.lock:
            return self.call_rewards.pop(episode, {})

    def take(self, episode: str) -> list[Sample]:
        """The episode's trajectories, and forget the episode (its calls and segments): what a trainer does once an
        episode is over, so a long run's memory does not grow with its episodes."""
        with self.lock:
            out = [seg.to_sample(episode, i) for i, seg in enumerate(self.segments.pop(episode, []))]
            self.calls.pop(episode, None)
            return out
