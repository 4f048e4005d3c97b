"""credo.simulate against hand-computed step times, on real SimPy."""

import math

import pytest

pytest.importorskip("simpy")

from credo.simulate.runner import simulate, simulate_mode  # noqa: E402
from credo.simulate.scenario import scenario_from_dict  # noqa: E402


def _scenario(modes, lengths, costs, steps=1, P=2, G=2, seed=0, agent=None, padding="padded"):
    w = {"prompts_per_step": P, "group_size": G, "lengths": lengths, "train_padding": padding}
    if agent:
        w["agent"] = agent
    return scenario_from_dict({"steps": steps, "seed": seed, "workload": w, "costs": costs, "modes": modes})


def test_sync_step_is_prefill_plus_longest_decode_plus_train_plus_sync():
    costs = {"decode_step_s": 0.01, "decode_seq_s": 0.001, "prefill_s": 0.5, "train_fixed_s": 1.0,
             "train_token_s": 0.01, "sync_s": 0.2}
    scn = _scenario([{"mode": "sync", "devices": 1, "max_batch": 100}],
                    {"kind": "fixed", "fixed": 10, "prompt_len": 5, "max_len": 10}, costs, steps=3)
    res = simulate(scn)[0]
    # 4 sequences admitted together: one prefill, then 10 steps of a batch of 4; 4 rows x (5 + 10) tokens trained
    expected = 0.5 + 10 * (0.01 + 4 * 0.001) + (1.0 + 0.01 * 4 * 15) + 0.2
    assert res.step_time_s == pytest.approx(expected)
    assert [r.end - r.start for r in res.records] == pytest.approx([expected] * 3)
    assert res.rollout_s == pytest.approx(0.64) and res.sync_s == pytest.approx(0.2)


def _naive_continuous(lengths, prompt_len, c0, c1, c2, prefill):
    """Step-by-step reference: every sequence in one batch, finished ones leave; one prefill up front."""
    t, left = prefill, list(lengths)
    ctx = [prompt_len] * len(left)
    while left:
        t += c0 + c1 * len(left) + c2 * sum(ctx)
        left = [n - 1 for n in left]
        ctx = [x + 1 for x in ctx]
        keep = [i for i, n in enumerate(left) if n > 0]
        left, ctx = [left[i] for i in keep], [ctx[i] for i in keep]
    return t


def test_continuous_batching_matches_a_step_by_step_reference():
    costs = {"decode_step_s": 0.02, "decode_seq_s": 0.003, "decode_ctx_s": 1e-5, "prefill_s": 0.1}
    groups = [[7, 31], [3, 12], [50, 1]]
    scn = _scenario([{"mode": "sync", "devices": 1, "max_batch": 64}],
                    {"kind": "empirical", "groups": groups, "order": "cycle", "prompt_len": 9, "max_len": 64},
                    costs, P=3, G=2)
    res = simulate(scn)[0]
    ref = _naive_continuous([n for g in groups for n in g], 9, 0.02, 0.003, 1e-5, 0.1)
    assert res.rollout_s == pytest.approx(ref, rel=1e-9)


def test_static_engine_pays_the_full_batch_until_the_longest_ends():
    costs = {"decode_step_s": 0.02, "decode_seq_s": 0.003, "decode_ctx_s": 1e-5, "prefill_s": 0.1,
             "prefill_token_s": 0.001}
    groups = [[7, 31], [3, 12]]
    scn = _scenario([{"mode": "sync", "devices": 1, "max_batch": 0, "engine": "static"}],
                    {"kind": "empirical", "groups": groups, "order": "cycle", "prompt_len": 9, "max_len": 64},
                    costs, P=2, G=2)
    res = simulate(scn)[0]
    # 4 rows decode 31 steps, every row's context growing by one per step (padding included)
    ref = 0.1 + 0.001 * 4 * 9 + sum(0.02 + 0.003 * 4 + 1e-5 * 4 * (9 + s) for s in range(31))
    assert res.rollout_s == pytest.approx(ref, rel=1e-9)


def test_static_split_over_devices_waits_for_the_slowest_share():
    costs = {"decode_step_s": 0.01}
    groups = [[10, 10], [40, 40]]  # device 0 gets prompt 0's two responses, device 1 prompt 1's
    scn = _scenario([{"mode": "sync", "devices": 2, "max_batch": 8}],
                    {"kind": "empirical", "groups": groups, "order": "cycle", "max_len": 64}, costs, P=2, G=2)
    res = simulate(scn)[0]
    assert res.rollout_s == pytest.approx(0.40)
    # device 0 idles 0.30 s of a 0.40 s step
    assert res.idle_s == pytest.approx(0.30 / 2)


def test_tail_batching_hand_worked_rounds():
    # P0 = 2, R0 = 1, eta_P = 1.5 -> 3 prompts x R' = 2 responses per short round; 0.01 s per decode step
    groups = [[10, 50], [20, 20], [100, 100]]
    scn = _scenario([{"mode": "tail_batching", "devices": 1, "max_batch": 100, "prompt_ratio": 1.5,
                      "max_responses": 2}],
                    {"kind": "empirical", "groups": groups, "order": "cycle", "max_len": 128},
                    {"decode_step_s": 0.01, "train_fixed_s": 1.0}, steps=3, P=2, G=1)
    res = simulate(scn)[0]
    recs = res.records
    # round 1: prompt 0 completes at step 10 (its 50-token twin aborted), prompt 1 at step 20 -> round over;
    # prompt 2 (two 100-token responses) is aborted into the queue. Round 2 repeats on prompts 3, 4, 5.
    assert [r.kind for r in recs] == ["short", "short", "long"]
    assert [r.rollout_s for r in recs] == pytest.approx([0.20, 0.20, 1.00])
    assert [r.end - r.start for r in recs] == pytest.approx([1.20, 1.20, 2.00])
    assert [sorted(r.prompt_ids) for r in recs] == [[0, 1], [3, 4], [2, 5]]
    assert [r.aborted for r in recs] == [3, 3, 0]
    assert [r.max_len for r in recs] == [20, 20, 100]
    assert [r.queue for r in recs] == [1, 2, 0]


def test_tail_batching_on_the_hf_race_sees_finishes_between_chunks_and_runs_long_rounds_static():
    # as above, with credo's hf backend: a response frees its slot (and completes its prompt) only at the next
    # multiple of 8 decode steps, and a long round is one generate() call that holds every row to the longest
    groups = [[10, 50], [20, 20], [100, 100], [10, 50], [20, 20], [60, 60]]
    scn = _scenario([{"mode": "tail_batching", "devices": 1, "max_batch": 100, "prompt_ratio": 1.5,
                      "max_responses": 2, "finish_quantum": 8, "long_engine": "static"}],
                    {"kind": "empirical", "groups": groups, "order": "cycle", "max_len": 128},
                    {"decode_step_s": 0.01, "decode_seq_s": 0.001, "train_fixed_s": 1.0}, steps=3, P=2, G=1)
    recs = simulate(scn)[0].records
    # short round: 6 rows for 16 steps (prompt 0's 10 seen at 16), its twin aborted in the step in progress (5 rows),
    # then 4 rows to step 24
    short = 16 * (0.01 + 6 * 0.001) + (0.01 + 5 * 0.001) + 7 * (0.01 + 4 * 0.001)
    # long round: prompts 2 (100) and 5 (60), both rows held for 100 steps (continuous: 60 x 2 rows + 40 x 1)
    assert [r.kind for r in recs] == ["short", "short", "long"]
    assert [r.rollout_s for r in recs] == pytest.approx([short, short, 100 * (0.01 + 2 * 0.001)])
    assert [r.max_len for r in recs] == [20, 20, 100]  # trained lengths are the responses' own


def test_tail_batching_trains_every_prompt_exactly_once():
    lengths = {"kind": "lognormal", "median": 200, "sigma_prompt": 1.0, "sigma_response": 0.3, "max_len": 4096,
               "prompt_len": 32}
    scn = _scenario([{"mode": "tail_batching", "devices": 2, "max_batch": 64}], lengths,
                    {"decode_step_s": 0.01, "decode_seq_s": 1e-4, "train_fixed_s": 0.5}, steps=30, P=8, G=4)
    res, ctx = simulate_mode(scn, scn.modes[0])
    trained = [pid for r in res.records for pid in r.prompt_ids]
    queued = [pid for pid, _ in ctx.extra["long_queue"]]
    assert len(trained) == len(set(trained)) == 30 * 8
    assert not set(trained) & set(queued)
    assert sorted(trained + queued) == list(range(ctx.next_prompt))
    assert all(r.samples == 8 * 4 for r in res.records)
    assert res.stats["long_rounds"] >= 1


@pytest.mark.parametrize("bound", [0, 1, 2])
def test_async_staleness_bound_is_never_exceeded(bound):
    lengths = {"kind": "lognormal", "median": 300, "sigma_prompt": 1.2, "sigma_response": 0.3, "max_len": 8192,
               "prompt_len": 64}
    costs = {"decode_step_s": 0.01, "decode_seq_s": 1e-4, "train_fixed_s": 2.0, "train_token_s": 1e-5, "sync_s": 0.5}
    scn = _scenario([{"mode": "async", "placement": "disaggregated", "rollout_devices": 3, "train_devices": 1,
                      "dispatch": "queue", "staleness": bound, "max_batch": 64}], lengths, costs,
                    steps=25, P=8, G=4)
    res = simulate(scn)[0]
    assert max(r.staleness_max for r in res.records) <= bound
    assert all(r.samples == 32 for r in res.records)
    if bound == 1:  # the heavy tail makes some groups too old: the bound is active, not vacuous
        assert res.stats["aborted"] > 0
        assert max(r.staleness_max for r in res.records) == 1


def test_async_beats_sync_on_a_long_tail_and_is_deterministic_by_seed():
    lengths = {"kind": "lognormal", "median": 300, "sigma_prompt": 1.0, "sigma_response": 0.3, "max_len": 8192,
               "prompt_len": 64}
    costs = {"decode_step_s": 0.01, "decode_seq_s": 1e-4, "train_fixed_s": 1.0, "train_token_s": 1e-5}
    modes = [{"name": "sync", "mode": "sync", "devices": 4, "max_batch": 64},
             {"name": "async", "mode": "async", "placement": "disaggregated", "rollout_devices": 3,
              "train_devices": 1, "dispatch": "queue", "staleness": 1, "max_batch": 64}]
    a = simulate(_scenario(modes, lengths, costs, steps=12, P=8, G=4, seed=3))
    b = simulate(_scenario(modes, lengths, costs, steps=12, P=8, G=4, seed=3))
    c = simulate(_scenario(modes, lengths, costs, steps=12, P=8, G=4, seed=4))
    assert [(r.step_time_s, r.stats) for r in a] == [(r.step_time_s, r.stats) for r in b]
    assert [r.end for r in a[1].records] == [r.end for r in b[1].records]
    assert a[0].step_time_s != c[0].step_time_s
    assert a[1].speedup > 1.2


def test_agentic_sync_turn_barriers_hand_worked():
    # 2 episodes x 2 turns, 10 tokens a turn, a 1 s environment step between turns (sigma 0), 8 observation
    # tokens prefilled at 0.001 s each
    agent = {"turns_median": 2, "turns_sigma": 0.0, "max_turns": 2, "env_latency_s": 1.0, "env_sigma": 0.0,
             "obs_tokens": 8}
    scn = _scenario([{"mode": "agentic_sync", "devices": 1, "max_batch": 8}],
                    {"kind": "fixed", "fixed": 10, "prompt_len": 4, "max_len": 10},
                    {"decode_step_s": 0.01, "prefill_token_s": 0.001, "train_fixed_s": 1.0}, P=1, G=2, agent=agent)
    res = simulate(scn)[0]
    expected_rollout = (0.001 * 2 * 4 + 10 * 0.01) + 1.0 + (0.001 * 2 * 8 + 10 * 0.01)
    assert res.rollout_s == pytest.approx(expected_rollout)
    assert res.records[0].tokens == 2 * (10 + 8 + 10)


def test_agentic_async_overlaps_environment_latency():
    agent = {"turns_median": 6, "turns_sigma": 0.5, "max_turns": 20, "env_latency_s": 2.0, "env_sigma": 1.0,
             "obs_tokens": 64}
    lengths = {"kind": "lognormal", "median": 100, "sigma_prompt": 0.5, "sigma_response": 0.5, "max_len": 2048,
               "prompt_len": 256}
    costs = {"decode_step_s": 0.01, "decode_seq_s": 1e-4, "train_fixed_s": 5.0, "train_token_s": 1e-5, "sync_s": 1}
    modes = [{"name": "sync", "mode": "agentic_sync", "devices": 4, "max_batch": 64},
             {"name": "async", "mode": "agentic_async", "placement": "disaggregated", "rollout_devices": 3,
              "train_devices": 1, "dispatch": "queue", "staleness": 1, "max_batch": 64}]
    res = simulate(_scenario(modes, lengths, costs, steps=8, P=4, G=4, agent=agent))
    assert res[1].speedup > 1.0
    assert max(r.staleness_max for r in res[1].records) <= 1


def _elastic(guard):
    # throughput-bound: 1024 responses for 2 x 128 dedicated slots, a mild tail
    lengths = {"kind": "lognormal", "median": 400, "sigma_prompt": 0.3, "sigma_response": 0.2, "max_len": 4096,
               "prompt_len": 128}
    costs = {"decode_step_s": 0.02, "decode_seq_s": 2e-4, "decode_ctx_s": 1e-8, "train_fixed_s": 1.0}
    serving = {"devices": 4, "base_batch": 8, "burst_batch": 96, "base_mean_s": 5.0, "burst_mean_s": 3.0,
               "slo_tpot_s": 0.05, "guard": guard, "max_batch": 256, "serving_ctx": 512}
    modes = [{"name": "fixed", "mode": "sync", "devices": 2, "max_batch": 128, "dispatch": "queue"},
             {"name": "elastic", "mode": "sync", "devices": 2, "max_batch": 128, "dispatch": "queue",
              "serving": serving}]
    return simulate(_scenario(modes, lengths, costs, steps=4, P=64, G=16))


def test_elastic_serving_capacity_speeds_rollout_and_the_reserve_guard_keeps_the_slo():
    fixed, safe = _elastic("reserve")
    assert safe.speedup > 1.3
    assert safe.stats["serving_shared_steps"] > 0 and safe.stats["slo_violating_steps"] == 0
    _, greedy = _elastic("none")
    assert greedy.stats["slo_violating_steps"] > 0


def test_scenario_errors_name_the_key():
    with pytest.raises(ValueError, match=r"modes\[0\]\.devicez"):
        _scenario([{"mode": "sync", "devicez": 1}], {"kind": "fixed", "fixed": 3}, {})
    with pytest.raises(ValueError, match=r"costs\.decode_step_s"):
        _scenario([{"mode": "sync"}], {"kind": "fixed", "fixed": 3}, {"decode_step_s": -1})
    with pytest.raises(ValueError, match="placement: disaggregated"):
        _scenario([{"mode": "async"}], {"kind": "fixed", "fixed": 3}, {})
    with pytest.raises(ValueError, match=r"workload.lengths.kind"):
        _scenario([{"mode": "sync"}], {"kind": "weibull"}, {})
    assert math.isfinite(simulate(_scenario([{"mode": "sync"}], {"kind": "fixed", "fixed": 3}, {}))[0].step_time_s)
