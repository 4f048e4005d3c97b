"""Losses, advantage estimators, KL and off-policy corrections as pure torch functions."""
