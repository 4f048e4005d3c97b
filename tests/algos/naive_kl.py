"""Naive references of the KL estimators: elementwise math on Python floats."""

from __future__ import annotations

import math

import torch

from tests.reference_registry import reference


def _elementwise(f, log_probs, ref_log_probs):
    B, T = log_probs.shape
    out = torch.zeros(B, T, dtype=torch.float64)
    for b in range(B):
        for t in range(T):
            out[b, t] = f(float(log_probs[b, t].detach()), float(ref_log_probs[b, t]))
    return out


@reference("kl", "k1")
def k1(log_probs, ref_log_probs):
    return _elementwise(lambda p, q: p - q, log_probs, ref_log_probs)


@reference("kl", "k2")
def k2(log_probs, ref_log_probs):
    return _elementwise(lambda p, q: 0.5 * (p - q) ** 2, log_probs, ref_log_probs)


def _k3(p, q):
    ratio = math.exp(q - p)  # pi_ref / pi
    return ratio - 1 - math.log(ratio)


@reference("kl", "k3")
def k3(log_probs, ref_log_probs):
    return _elementwise(_k3, log_probs, ref_log_probs)


@reference("kl", "k3_clamped")
def k3_clamped(log_probs, ref_log_probs):
    return _elementwise(lambda p, q: max(-10.0, min(10.0, _k3(p, q))), log_probs, ref_log_probs)
