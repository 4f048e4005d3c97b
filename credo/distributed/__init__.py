"""DeepSpeed engine, rollout backends, weight sync."""
