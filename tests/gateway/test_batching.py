"""BatchingSampler: concurrent calls within the window are one sample call, each gets its own prompts' samples in
order with its own seeds; calls of other settings are not mixed in; a failure reaches every waiting call."""

from __future__ import annotations

import threading

import pytest

from credo.distributed.rollout import Sample


class FakeSampler:
    """Echoes each prompt's last token + 1 and its seed; records each call."""

    def __init__(self, fail: bool = False):
        self.calls, self.fail = [], fail

    def __call__(self, prompts, *, max_new_tokens, temperature, top_p, seeds):
        self.calls.append((len(prompts), max_new_tokens, None if seeds is None else list(seeds)))
        if self.fail:
            raise RuntimeError("backend down")
        return [Sample(list(p), [p[-1] + 1], [1], [-float(s or 0)], True) for p, s in
                zip(prompts, seeds or [None] * len(prompts))]


def call_together(batcher, requests):
    out = [None] * len(requests)

    def one(i, prompts, kw):
        try:
            out[i] = batcher(prompts, **kw)
        except RuntimeError as e:
            out[i] = e

    threads = [threading.Thread(target=one, args=(i, p, kw)) for i, (p, kw) in enumerate(requests)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_concurrent_calls_share_one_sample_call_and_get_their_own_samples():
    from credo.gateway.batching import BatchingSampler

    fake = FakeSampler()
    b = BatchingSampler(fake, window_s=0.3)
    kw = dict(max_new_tokens=4, temperature=1.0, top_p=1.0)
    reqs = [([[10 * i + 1], [10 * i + 2]], {**kw, "seeds": [100 * i, 100 * i + 1]}) for i in range(3)]
    reqs.append(([[7]], {**kw, "max_new_tokens": 8, "seeds": [5]}))  # other settings: its own call
    out = call_together(b, reqs)
    for i in range(3):
        assert [s.response_ids for s in out[i]] == [[10 * i + 2], [10 * i + 3]]
        assert [s.rollout_log_probs for s in out[i]] == [[-100.0 * i], [-100.0 * i - 1]]
    assert [s.response_ids for s in out[3]] == [[8]]
    assert sorted(c[:2] for c in fake.calls) == [(1, 8), (6, 4)]


def test_a_failing_sample_call_reaches_every_waiting_call():
    from credo.gateway.batching import BatchingSampler

    b = BatchingSampler(FakeSampler(fail=True), window_s=0.2)
    kw = dict(max_new_tokens=4, temperature=1.0, top_p=1.0, seeds=None)
    out = call_together(b, [([[1]], kw), ([[2]], kw)])
    assert all(isinstance(o, RuntimeError) and "backend down" in str(o) for o in out)
    with pytest.raises(ValueError, match="window_s > 0"):
        BatchingSampler(FakeSampler(), window_s=0)
