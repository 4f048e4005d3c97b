"""Ray as credo's engine past one machine: rollout, reward, judge and env workers as Ray actors (docs/cluster.md).

The stage API stays the same; Ray only changes where a stage runs. Each module is a drop-in behind a seam that
exists in-process: `rollout.RayRolloutBackend` (the rollout backend protocol), `rewards.RayRewardWorker` (the
`RewardWorker` interface), `envs.RayEnvPool` (GEM env proxies for the multi-turn source). `config` holds the
recipe's `cluster:` section. Importing this package does not import Ray; building one of those does.
"""
