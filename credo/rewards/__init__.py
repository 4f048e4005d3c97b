"""Verifiers, tasks and reward workers."""
