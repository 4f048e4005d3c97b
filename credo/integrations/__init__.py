"""Adapters that bring credo's losses into other trainers (each imports its framework only when used)."""
