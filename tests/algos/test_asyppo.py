"""AsyPPO helpers (arXiv 2510.01656) against their loop references, hand-worked cases and properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from credo.algos import asyppo_masks, asyppo_value_mean, critic_shards
from tests.algos._inputs import make_mask
from tests.algos.naive_asyppo import share, token_sigma
from tests.reference_registry import REFERENCES, load_registries

load_registries()
SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
naive_shards = REFERENCES[("function", "critic_shards")]
naive_masks = REFERENCES[("function", "asyppo_masks")]
naive_mean = REFERENCES[("function", "asyppo_value_mean")]


# critic_shards ---------------------------------------------------------------------------------


def test_critic_shards_hand_worked():
    # groups 3 (positions 0, 2, 3, 6), 1 (1, 4), 7 (5): interleaved, sizes 4, 2, 1
    ids = torch.tensor([3, 1, 3, 3, 1, 7, 3])
    assert critic_shards(ids, 2).tolist() == [0, 0, 1, 0, 1, 0, 1]
    assert critic_shards(ids, 3).tolist() == [0, 0, 1, 2, 1, 0, 0]
    assert critic_shards(ids, 1).tolist() == [0] * 7
    assert critic_shards(ids.int(), 2).dtype == torch.long
    assert critic_shards(torch.zeros(0, dtype=torch.long), 2).shape == (0,)


@st.composite
def grouped_batch(draw):
    sizes = draw(st.lists(st.integers(1, 9), min_size=1, max_size=6))
    ids = draw(st.lists(st.integers(-5, 1000), min_size=len(sizes), max_size=len(sizes), unique=True))
    batch = [g for g, n in zip(ids, sizes) for _ in range(n)]
    order = draw(st.permutations(range(len(batch))))  # interleave the groups
    return [batch[i] for i in order], draw(st.integers(1, 5))


@SETTINGS
@given(grouped_batch())
def test_critic_shards_matches_loops_and_partitions_every_group(case):
    ids, M = case
    group_ids = torch.tensor(ids)
    got = critic_shards(group_ids, M)
    assert torch.equal(got, naive_shards(group_ids, M))
    assert got.dtype == torch.long and bool(((got >= 0) & (got < M)).all())
    for g in set(ids):
        members = [i for i, x in enumerate(ids) if x == g]
        shards = [int(got[i]) for i in members]
        counts = [shards.count(m) for m in range(M)]
        assert sum(counts) == len(members)  # every sample in exactly one critic's shard
        assert max(counts) - min(counts) <= 1  # uniform split
        if len(members) >= M:  # every critic sees every prompt
            assert min(counts) >= 1
        assert shards == [r % M for r in range(len(members))]  # batch order inside the group
    # a sample's critic depends on its own group only: dropping another group changes nothing
    dropped = ids[0]
    keep = [i for i, x in enumerate(ids) if x != dropped]
    if keep:
        assert torch.equal(critic_shards(group_ids[keep], M), got[keep])


def test_critic_shards_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"group_ids has dtype torch.float32, expected an integer dtype"):
        critic_shards(torch.zeros(3), 2)
    with pytest.raises(ValueError, match=r"group_ids has shape \[2, 3\], expected 1 dimensions"):
        critic_shards(torch.zeros(2, 3, dtype=torch.long), 2)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match=r"num_critics is .*, expected an int >= 1"):
            critic_shards(torch.zeros(3, dtype=torch.long), bad)


# asyppo_value_mean -----------------------------------------------------------------------------


def test_value_mean_matches_loops_and_reaches_every_critic():
    g = torch.Generator().manual_seed(3)
    values = torch.randn(3, 4, 5, generator=g, dtype=torch.float64, requires_grad=True)
    got = asyppo_value_mean(values)
    torch.testing.assert_close(got, naive_mean(values.detach()))
    (grad,) = torch.autograd.grad(got.sum(), values)
    torch.testing.assert_close(grad, torch.full_like(grad, 1 / 3))
    with pytest.raises(ValueError, match=r"values has shape \[4, 5\], expected 3 dimensions"):
        asyppo_value_mean(values[0])


# asyppo_masks ----------------------------------------------------------------------------------


def test_masks_hand_worked_with_ties():
    # M = 2: sigma = |V1 - V2| / 2. Token sigmas, flat order:
    #   row 0: 0, 1, 0, 1.5      row 1: 0.5, 1, 1.5, 2
    v1 = torch.tensor([[0.0, 1.0, 2.0, 3.0], [0.0, 0.0, 0.0, 0.0]])
    v2 = torch.tensor([[0.0, 3.0, 2.0, 0.0], [1.0, 2.0, 3.0, 4.0]])
    values = torch.stack([v1, v2])
    mask = torch.ones(2, 4, dtype=torch.bool)
    adv, ent = asyppo_masks(values, mask, 0.25, 0.25)  # n = 8: two tokens each
    # lowest: the two sigma-0 tokens (0, 0), (0, 2)
    assert adv.tolist() == [[False, True, False, True], [True, True, True, True]]
    # highest: 2 at (1, 3), then one of the two 1.5 (flat 3 and 6): the later one, (1, 2)
    assert ent.tolist() == [[True, True, True, True], [True, True, False, False]]
    # three of the 1-or-lower (0, 0, 0.5, 1, 1): ties at 1 (flat 1 and 5) drop the earlier one first
    adv, _ = asyppo_masks(values, mask, 0.5, 0.0)  # n = 8: four tokens
    assert adv.tolist() == [[False, False, False, True], [False, True, True, True]]
    # a masked-out token never counts and is False in both masks
    mask[0, 0] = False
    adv, ent = asyppo_masks(values, mask, 0.25, 0.25)  # n = 7: floor(1.75) = 1 each
    assert adv.tolist() == [[False, True, False, True], [True, True, True, True]]
    assert ent.tolist() == [[False, True, True, True], [True, True, True, False]]


def _values_with_ties(M, B, T, generator, pool_size):
    """Each token's critic values are one of `pool_size` random vectors, in a random critic order
    per token: the same values in any order are an exact tie."""
    pool = torch.randn(pool_size, M, generator=generator, dtype=torch.float64)
    pick = torch.randint(0, pool_size, (B, T), generator=generator)
    order = torch.argsort(torch.rand(B, T, M, generator=generator), dim=-1)
    return pool[pick].gather(-1, order).permute(2, 0, 1).contiguous()


def test_same_critic_values_in_another_order_tie_exactly():
    # {0, 1, 2, 2} in two orders: a plain std rounds them differently (0x1.a887293fd6f35p-1 vs
    # ...f34p-1 in float64); sorted first, they tie and the earlier token is dropped first.
    values = torch.tensor([[2.0, 0.0], [2.0, 1.0], [0.0, 2.0], [1.0, 2.0]])[:, None, :].double()
    mask = torch.ones(1, 2, dtype=torch.bool)
    for perm in ([0, 1, 2, 3], [3, 1, 0, 2], [2, 3, 1, 0]):
        adv, ent = asyppo_masks(values[perm], mask, 0.5, 0.5)
        assert adv.tolist() == [[False, True]] and ent.tolist() == [[True, False]]


def test_spreads_one_ulp_apart_are_ranked_not_tied():
    # Token 0's first critic is one float32 ulp above token 1's, so its spread is (barely) larger.
    # The population std keeps the two sigmas apart; the sample std (/(M-1)) rounds both to the
    # same float, a tie that would drop token 0 (earlier) instead of token 1.
    hi, lo, other = 0.49625661969184875, 0.49625658988952637, 0.025811970233917236
    values = torch.tensor([[hi, lo], [other, other]], dtype=torch.float32)[:, None, :]
    mask = torch.ones(1, 2, dtype=torch.bool)
    assert token_sigma(values, 0, 0) > token_sigma(values, 0, 1)
    expected = naive_masks(values, mask, 0.5, 0.5)
    assert expected[0].tolist() == [[True, False]]
    got = asyppo_masks(values, mask, 0.5, 0.5)
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


@pytest.mark.parametrize("M", [2, 3])
@pytest.mark.parametrize("fracs", [(0.2, 0.2), (0.0, 0.0), (1.0, 0.0), (0.0, 1.0), (0.5, 0.5), (0.29, 0.71), (0.33, 0.1)])
def test_masks_match_loops(M, fracs):
    g = torch.Generator().manual_seed(M * 100 + int(fracs[0] * 100))
    for B, T, pool in [(1, 1, 1), (3, 7, 4), (5, 20, 1000), (4, 25, 3), (2, 50, 50)]:
        values = _values_with_ties(M, B, T, g, pool)
        mask = make_mask(B, T, g)
        got = asyppo_masks(values, mask, *fracs)
        expected = naive_masks(values, mask, *fracs)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1]), (B, T, pool)
        n = int(mask.sum())
        assert int((mask & ~got[0]).sum()) == share(fracs[0], n)
        assert int((mask & ~got[1]).sum()) == share(fracs[1], n)


def test_decimal_share_and_all_masked():
    # 0.29 * 100 is 28.999999999999996 in binary; the rule reads 0.29 as 29/100.
    values = torch.randn(2, 4, 25, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    mask = torch.ones(4, 25, dtype=torch.bool)
    adv, ent = asyppo_masks(values, mask, 0.29, 0.71)
    assert int((~adv).sum()) == 29 and int((~ent).sum()) == 71
    assert not bool((~adv & ~ent).any())  # 29 + 71 = 100: complementary
    for M in (2, 3):
        empty = torch.zeros(3, 5, dtype=torch.bool)
        adv, ent = asyppo_masks(torch.randn(M, 3, 5), empty, 0.2, 0.2)
        assert not adv.any() and not ent.any()


def test_masks_in_half_precision_drop_the_right_counts():
    g = torch.Generator().manual_seed(4)
    values = torch.randn(2, 6, 30, generator=g).to(torch.bfloat16)
    mask = make_mask(6, 30, g)
    adv, ent = asyppo_masks(values, mask, 0.2, 0.2)
    n = int(mask.sum())
    assert int((mask & ~adv).sum()) == share(0.2, n) and int((mask & ~ent).sum()) == share(0.2, n)
    assert not bool((~mask & (adv | ent)).any())


@st.composite
def mask_case(draw):
    M = draw(st.integers(2, 4))
    B, T = draw(st.integers(1, 5)), draw(st.integers(1, 9))
    low = draw(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 0.8, 1.0]))
    high = draw(st.sampled_from([h for h in (0.0, 0.1, 0.2, 0.3, 0.5, 1.0) if low + h <= 1]))
    integer_values = draw(st.booleans())  # small integers: many exact ties
    return M, B, T, low, high, integer_values, draw(st.integers(0, 2**16))


@SETTINGS
@given(mask_case())
def test_mask_properties(case):
    M, B, T, low, high, integer_values, seed = case
    g = torch.Generator().manual_seed(seed)
    if integer_values:
        values = torch.randint(0, 3, (M, B, T), generator=g).double()
    else:
        values = torch.randn(M, B, T, generator=g, dtype=torch.float64)
    mask = make_mask(B, T, g)
    adv, ent = asyppo_masks(values, mask, low, high)
    n = int(mask.sum())
    assert not bool((~mask & (adv | ent)).any())  # invalid tokens are False in both
    dropped_adv, dropped_ent = mask & ~adv, mask & ~ent
    assert int(dropped_adv.sum()) == share(low, n) and int(dropped_ent.sum()) == share(high, n)
    assert not bool((dropped_adv & dropped_ent).any())  # a token is never both "agree" and "disagree"
    sigma = {(b, t): token_sigma(values, b, t) for b in range(B) for t in range(T) if bool(mask[b, t])}
    slack = 1e-12  # different multisets with equal exact sigma may round apart by an ulp
    if dropped_adv.any() and adv.any():
        assert max(sigma[i] for i in _where(dropped_adv)) <= min(sigma[i] for i in _where(adv)) + slack
    if dropped_ent.any() and ent.any():
        assert min(sigma[i] for i in _where(dropped_ent)) >= max(sigma[i] for i in _where(ent)) - slack
    # doubling the values (exact in binary) doubles sigma; reordering the critics changes nothing
    adv2, ent2 = asyppo_masks(2 * values, mask, low, high)
    assert torch.equal(adv2, adv) and torch.equal(ent2, ent)
    adv3, ent3 = asyppo_masks(values.flip(0), mask, low, high)
    assert torch.equal(adv3, adv) and torch.equal(ent3, ent)
    if not integer_values or M == 2:  # else equal exact sigmas of different multisets may round apart
        expected = naive_masks(values, mask, low, high)
        assert torch.equal(adv, expected[0]) and torch.equal(ent, expected[1])


def _where(flags):
    return [(int(b), int(t)) for b, t in flags.nonzero().tolist()]


def test_mask_errors_name_the_argument():
    values, mask = torch.zeros(2, 3, 4), torch.ones(3, 4, dtype=torch.bool)
    expected = r"values has shape \[2, 3, 5\], expected \[M, 3, 4\] \(M critics\) matching mask \[3, 4\]"
    with pytest.raises(ValueError, match=expected):
        asyppo_masks(torch.zeros(2, 3, 5), mask, 0.2, 0.2)
    with pytest.raises(ValueError, match=r"values has shape \[3, 4\], expected \[M, 3, 4\]"):
        asyppo_masks(torch.zeros(3, 4), mask, 0.2, 0.2)
    with pytest.raises(ValueError, match=r"values has shape \[1, 3, 4\]: 1 critic\(s\), expected M >= 2"):
        asyppo_masks(torch.zeros(1, 3, 4), mask, 0.2, 0.2)
    with pytest.raises(ValueError, match=r"values has dtype torch.int64, expected a floating dtype"):
        asyppo_masks(torch.zeros(2, 3, 4, dtype=torch.long), mask, 0.2, 0.2)
    with pytest.raises(ValueError, match=r"mask has shape \[12\], expected 2 dimensions"):
        asyppo_masks(values, mask.reshape(-1), 0.2, 0.2)
    with pytest.raises(ValueError, match=r"mask has dtype torch.int64, expected bool or floating"):
        asyppo_masks(values, mask.long(), 0.2, 0.2)
    for bad in (-0.1, 1.5, float("nan"), True, None):
        with pytest.raises(ValueError, match=r"low_frac is .*, expected a number in \[0, 1\]"):
            asyppo_masks(values, mask, bad, 0.2)
        with pytest.raises(ValueError, match=r"high_frac is .*, expected a number in \[0, 1\]"):
            asyppo_masks(values, mask, 0.2, bad)
    with pytest.raises(ValueError, match=r"low_frac \+ high_frac is 0.7 \+ 0.4 = 1.1, expected at most 1"):
        asyppo_masks(values, mask, 0.7, 0.4)
    bad_values = values.clone()
    bad_values[1, 2, 3] = float("nan")
    with pytest.raises(ValueError, match=r"values has non-finite values"):
        asyppo_masks(bad_values, mask, 0.2, 0.2)
    mask[2, 3] = False  # NaN on a masked-out token is ignored
    asyppo_masks(bad_values, mask, 0.2, 0.2)
