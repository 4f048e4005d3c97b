"""P-GenRM pieces: chain parsing, spherical k-means and prototype
neighbours against loops, dual-granularity fusion by hand."""

import math

import pytest
import torch

from credo.families.judges.pgenrm.judge import fuse_scores, kmeans_sphere, parse_evaluation_chain, prototype_neighbours


@pytest.mark.parametrize("text, want", [
    ('... {"rationale": "x", "better_response": {"response_1": 7, "response_2": 4.5}}', (7.0, 4.5)),
    ("persona: likes carries \\boxed{3, 9}", (3.0, 9.0)),
    ("\\boxed{3, 9} then \\boxed{8,2}", (8.0, 2.0)),
    ("\\boxed{11, 2}", None),
    ('"better_response": {"response_1": "nan"}', None),
    ("no scores", None),
    ("\\boxed{٣, 9}", None),
])
def test_parse_evaluation_chain(text, want):
    assert parse_evaluation_chain(text) == want


def test_kmeans_recovers_planted_clusters_and_assigns_to_the_nearest_centroid():
    g = torch.Generator().manual_seed(0)
    centres = torch.nn.functional.normalize(torch.randn(3, 16, generator=g), dim=-1)
    x = torch.cat([c + 0.05 * torch.randn(20, 16, generator=g) for c in centres])
    c, assign = kmeans_sphere(x, 3, seed=0)
    truth = torch.arange(3).repeat_interleave(20)
    for t in range(3):  # each planted cluster maps to one prototype, and prototypes differ
        assert assign[truth == t].unique().numel() == 1
    assert assign.unique().numel() == 3
    xn = torch.nn.functional.normalize(x, dim=-1)
    for i in range(x.shape[0]):  # loop check of the assignment rule
        sims = [float(xn[i] @ c[j]) for j in range(3)]
        assert assign[i].item() == max(range(3), key=lambda j: sims[j])


def test_prototype_neighbours_match_a_loop():
    g = torch.Generator().manual_seed(1)
    members = torch.randn(30, 8, generator=g)
    c, assign = kmeans_sphere(members, 4, seed=1)
    q = torch.randn(8, generator=g)
    got = prototype_neighbours(q, c, members, assign, topk=3).tolist()
    qn = q / q.norm()
    j = max(range(4), key=lambda k: float(c[k] @ qn))
    cand = [i for i in range(30) if assign[i] == j]
    cand.sort(key=lambda i: -float(members[i] @ qn / members[i].norm()))
    assert got == cand[:3]


def test_fusion_by_hand():
    # self mean (6, 4), neighbour mean (2, 8) -> equal weights (4, 6)
    assert fuse_scores([(7, 3), (5, 5), None], [(2, 8)]) == pytest.approx((4.0, 6.0))
    assert fuse_scores([(7, 3)], [None], c_self=0.5, c_nb=0.5) == pytest.approx((7.0, 3.0))
    assert fuse_scores([None], []) is None
    s = fuse_scores([(6, 4)], [(2, 8)], c_self=0.75, c_nb=0.25)
    assert s == pytest.approx((0.75 * 6 + 0.25 * 2, 0.75 * 4 + 0.25 * 8)) and not any(map(math.isnan, s))
