"""`credo simulate`: a discrete-event simulator (SimPy) of RL post-training on a cluster of rollout and training
devices, to predict step times and speed-ups of rollout schedules before building or renting them.

Modules, in the order a step flows through them:
- `scenario`: the YAML scenario (workload, costs, modes) with every key checked;
- `lengths`: response-length distributions, parametric or fitted from a run's rollout dumps;
- `costs`: seconds per decode step (batch- and context-dependent), prefill, train, reward, weight sync;
- `engine`: rollout devices as SimPy processes (continuous or static batching) and their dispatch;
- `rlvr` (sync, tail batching), `asynchronous` (staleness-bounded async, trajectory-level agents), `agentic`
  (episodes, the turn-synchronous baseline), `elastic` (ROSE's shared serving devices);
- `runner` (simulate a scenario), `report` (table and plot), `calibrate` and `validate` (this machine), `cli`.

Nothing here is imported by `import credo`; SimPy comes with the `simulate` (and `test`) extra.
The model, its inputs and the validation: docs/simulate.md.
"""
