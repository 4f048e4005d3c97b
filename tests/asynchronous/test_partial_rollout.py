"""Partial rollout (credo.distributed.partial), worked by hand in this process: which tokens carry which version, the
behaviour log-prob of each token under the weights that drew it, a sample's staleness from its oldest token, and
which group the staleness bound drops."""

from __future__ import annotations

import copy

import pytest
import torch

from credo.distributed.partial import generate_partial
from credo.distributed.rollout import HFBackend, Sample
from credo.schedules.overlap import partial_metrics
from credo.train.batch import Batch
from credo.train.staleness import staleness_metrics
from tests.asynchronous.common import perturb
from tests.asynchronous.test_overlap import scored
from tests.fakes import sharp_tiny_policy

CAP = 10


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    model, tok = sharp_tiny_policy(tmp_path_factory.mktemp("cache"), 6.0)
    return model.eval(), tok


def prompts_of(tok):
    return [tok(t, add_special_tokens=False)["input_ids"] for t in ("3+4=", "12+5=", "7+7=")]


class Weights:
    """Stands in for the trainer's double buffer: version 1 is published once the sampler has decoded `after`
    tokens; taking it loads `new` into the backend."""

    def __init__(self, backend, new, after: int):
        self.backend, self.new, self.after, self.asked = backend, new, after, 0

    def newer(self, have: int) -> bool:
        self.asked += 1
        return have < 1 and self.asked >= self.after

    def take(self, have: int) -> int:
        if have < 1:
            self.backend.sync_weights(self.new, 1)
        return max(have, 1)


def test_without_an_update_a_partial_rollout_is_one_uninterrupted_call(policy):
    model, tok = policy
    backend = HFBackend(model, tok, per_sample_seeds=True)
    whole = backend.generate(prompts_of(tok), max_new_tokens=CAP, temperature=1.0, top_p=1.0, seeds=[5, 6, 7])
    parts = generate_partial(backend, prompts_of(tok), [5, 6, 7], max_new_tokens=CAP, temperature=1.0, top_p=1.0,
                             version=0, newer=lambda v: False, take=lambda v: v)
    for a, b in zip(whole, parts):
        assert (a.response_ids, a.rollout_log_probs, a.finished) == (b.response_ids, b.rollout_log_probs, b.finished)
        assert b.policy_versions == [0] * len(b.response_ids) and b.meta["interrupted"] == 0


def test_an_update_after_three_tokens_stamps_the_rest_with_the_new_version_and_its_log_probs(policy):
    model, tok = policy
    old = copy.deepcopy(model)
    new = copy.deepcopy(model)
    with torch.no_grad():
        perturb(new, 1)
    backend = HFBackend(copy.deepcopy(old), tok, per_sample_seeds=True)
    weights = Weights(backend, new, after=3)
    seeds = [5, 6, 7]
    out = generate_partial(backend, prompts_of(tok), seeds, max_new_tokens=CAP, temperature=1.0, top_p=1.0,
                           version=0, newer=weights.newer, take=weights.take)
    first = HFBackend(old, tok, per_sample_seeds=True).generate(prompts_of(tok), max_new_tokens=CAP, temperature=1.0,
                                                                top_p=1.0, seeds=seeds)
    assert any(s.meta["interrupted"] for s in out)
    for s, f in zip(out, first):
        k = min(3, len(f.response_ids))  # a response that ended before the update is all version 0
        assert s.response_ids[:k] == f.response_ids[:k]  # what the old weights drew before the update
        assert s.policy_versions == [0] * k + [1] * (len(s.response_ids) - k)
        assert s.policy_version == 0  # the oldest token's version
        assert s.meta["interrupted"] == (1 if len(s.response_ids) > 3 else 0)
        # each token's behaviour log-prob is that of the weights that drew it, scored by the trainer's forward
        with torch.no_grad():
            by_old, by_new = scored(old, [s])[0], scored(new, [s])[0]
        want = torch.cat([by_old[:k], by_new[k:]])
        torch.testing.assert_close(torch.tensor(s.rollout_log_probs), want, atol=1e-4, rtol=0)  # float rounding of batch shapes
        if len(s.response_ids) > 3:  # and the new version's tokens are not what the old weights would have scored
            assert not torch.allclose(by_old[k:], by_new[k:], atol=1e-3)


def sample(first_version: int, versions: list[int], interrupted: int = 0) -> Sample:
    return Sample([1], [2] * len(versions), [1] * len(versions), [0.0] * len(versions), True,
                  min(versions), meta={"interrupted": interrupted}, policy_versions=versions)


def test_staleness_counts_from_the_oldest_token_and_the_bound_drops_that_group():
    """Step 4 with S = 1 accepts versions >= 2. Group A: every token from version 3. Group B: one sample began under
    version 1 and was continued under 3 (span 2), so the group's staleness is 4 - 1 - 1 = 2 > S: dropped, although
    most of its tokens are fresh."""
    group_a = [sample(3, [3, 3, 3]), sample(3, [3, 3])]
    group_b = [sample(1, [1, 3, 3], interrupted=1), sample(2, [2, 2, 3], interrupted=1)]
    from credo.schedules.overlap import Group

    a, b = Group(0, None, group_a), Group(1, None, group_b)
    S, step = 1, 4
    assert (a.version, b.version) == (3, 1)
    assert [step - 1 - g.version > S for g in (a, b)] == [False, True]  # OverlapSource.rollout's drop rule
    batch = Batch(samples=group_a + group_b, problems=[None] * 4, group_ids=torch.tensor([0, 0, 1, 1]), step=step)
    m = staleness_metrics(batch, S)
    assert m["async/staleness_max"] == 2 and m["async/stale_frac"] == 0.25
    assert partial_metrics(batch) == {"async/version_span_mean": (0 + 0 + 2 + 1) / 4, "async/version_span_max": 2.0,
                                      "async/interrupted_frac": 0.5}


def test_a_row_that_samples_padding_up_to_the_cap_ends_there():
    """A row whose last tokens are the padding id loses them from its sample (response_lengths cuts trailing
    padding); the call still ran to the cap, so the row is done, not continued again and again."""

    class PadBackend:
        per_sample_seeds = True

        def __init__(self):
            self.calls = 0

        def generate(self, prompts, *, max_new_tokens, stop_when, **kw):
            self.calls += 1
            for _ in range(max_new_tokens):
                stop_when()
            return [Sample(p, [7], [1], [-0.5], False) for p in prompts]  # 'max_new_tokens' drawn, pads cut

    backend = PadBackend()
    out = generate_partial(backend, [[1, 2]], [0], max_new_tokens=4, temperature=1.0, top_p=1.0, version=0,
                           newer=lambda v: False, take=lambda v: v)
    assert backend.calls == 1 and out[0].response_ids == [7] and not out[0].finished
