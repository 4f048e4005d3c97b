"""Partial rollout and the recompute of pi_old in credo.simulate, against hand-worked traces; with both off the
simulator gives, bit for bit, the numbers it gave before they existed."""

import pytest

pytest.importorskip("simpy")

from credo.simulate.runner import simulate  # noqa: E402
from credo.simulate.scenario import scenario_from_dict  # noqa: E402


def _scenario(modes, groups, costs, steps, P=1, G=1, prompt_len=10, seed=0):
    lengths = {"kind": "empirical", "groups": groups, "order": "cycle", "prompt_len": prompt_len, "max_len": 64}
    return scenario_from_dict({"steps": steps, "seed": seed, "costs": costs, "modes": modes,
                               "workload": {"prompts_per_step": P, "group_size": G, "lengths": lengths}})


# one prompt a step, one response each; a decode step 1 s whatever the batch, 0.1 s a prefilled token, 2.5 s a step
COSTS = {"decode_step_s": 1.0, "prefill_token_s": 0.1, "train_fixed_s": 2.5}


def _async(**kw):
    return {"name": "async", "mode": "async", "placement": "disaggregated", "rollout_devices": 1,
            "train_devices": 1, "staleness": 1, "max_batch": 8, **kw}


def test_partial_rollout_on_a_continuous_engine_hand_worked():
    # The responses cycle 2, 6, 2, 6 tokens (prompt 10). S = 1, so groups 0 and 1 start at t = 0.
    #   0-2    prefill 2 x 10 tokens (2 s); 2-4 two decode steps: response 0 ends at 4 (version 0)
    #   step 1: trains response 0, 4-6.5; the sync at 6.5 waits for the decode step in progress (response 1's
    #           5th token) to end at 7: response 1 is interrupted there with 5 of its 6 tokens, the oldest of
    #           version 0; step 1 ends at 7 (sync 0.5 s), and the gate lets group 2 in (version 1)
    #   7-8.5  response 1 is prefilled again under version 1: 10 + 5 tokens, 1.5 s
    #   8.5-9.5 response 2's prefill (10 tokens); 9.5-10.5 one step: response 1 ends (versions 0..1, span 1)
    #   step 2: 7-10.5 waiting, trains response 1 (staleness 1 = the bound), 10.5-13; response 2 ends at 11.5
    #   step 3: response 2 is ready at 13 (version 1, staleness 1): trains 13-15.5; response 3 (6 tokens) started
    #           at 13 (prefill to 14) is interrupted by the sync after its 2nd token, at 16: step 3 ends at 16
    res = simulate(_scenario([_async(partial_rollout=True)], [[2], [6]], COSTS, steps=3))[0]
    recs = res.records
    assert [r.start for r in recs] == pytest.approx([0, 7, 13]) and [r.end for r in recs] == pytest.approx([7, 13, 16])
    assert [r.rollout_s for r in recs] == pytest.approx([4, 3.5, 0])
    assert [r.sync_s for r in recs] == pytest.approx([0.5, 0, 0.5])
    assert [r.staleness_max for r in recs] == [0, 1, 1]
    assert [r.interrupted for r in recs] == [0, 1, 0]
    assert res.step_time_s == pytest.approx(16 / 3)
    assert res.stats["interrupted_frac"] == pytest.approx(1 / 3)
    assert res.stats["version_span_mean"] == pytest.approx(1 / 3) and res.stats["version_span_max"] == 1
    # the same without partial rollout: no sync pause (sync_s 0), no second prefill; group 2 is admitted at the
    # step boundary after 6.5 (t = 7, prefill to 8), response 1 ends at 9; steps end at 6.5, 11.5, 14
    off = simulate(_scenario([_async()], [[2], [6]], COSTS, steps=3))[0]
    assert [r.end for r in off.records] == pytest.approx([6.5, 11.5, 14])
    assert "interrupted_frac" not in off.stats


def test_partial_rollout_on_credos_overlap_worker_hand_worked():
    # engine static in mode async: credo's hf overlap worker, one generate call per request of max_batch rows
    # (here a group of 2). Groups cycle [2, 3], [5, 2], [1, 1].
    #   call 1 (group 0): prefill 2 x 10 tokens 0-2, 3 steps to 5; step 1 trains it 5-7.5, publishes version 1
    #   call 2 (group 1, version 0): prefill 5-7, decoding from 7; the publish at 7.5 stops it after the token in
    #     progress (t = 8, 1 token each); the 2 rows go on under version 1: prefill 2 x (10 + 1) = 2.2 s to 10.2,
    #     then 4 more steps to 14.2 (the row of 2 tokens waits as padding): both rows interrupted, span 1
    #   step 2 (7.5-): waits for group 1 until 14.2, trains to 16.7 (the trainer never waits for the worker)
    #   call 3 (group 2, version 1): prefill 14.2-16.2, one step to 17.2 (the publish at 16.7 finds it on its
    #     last token); step 3 waits from 16.7 to 17.2, trains to 19.7
    mode = _async(engine="static", max_batch=2, partial_rollout=True)
    res = simulate(_scenario([mode], [[2, 3], [5, 2], [1, 1]], COSTS, steps=3, G=2))[0]
    recs = res.records
    assert [r.end for r in recs] == pytest.approx([7.5, 16.7, 19.7])
    assert [r.rollout_s for r in recs] == pytest.approx([5, 6.7, 0.5])
    assert [r.interrupted for r in recs] == [0, 2, 0]
    assert [r.staleness_max for r in recs] == [0, 1, 1]
    assert res.stats["interrupted_frac"] == pytest.approx(2 / 6) and res.stats["version_span_max"] == 1
    # without partial rollout call 2 runs to its end under version 0 (prefill 5-7, 5 steps to 12); call 3 takes
    # version 1 between calls (prefill 12-14, a step to 15): steps end at 7.5, 14.5, 17.5
    off = simulate(_scenario([_async(engine="static", max_batch=2)], [[2, 3], [5, 2], [1, 1]], COSTS, steps=3, G=2))[0]
    assert [r.end for r in off.records] == pytest.approx([7.5, 14.5, 17.5])
    assert [r.staleness_max for r in off.records] == [0, 1, 1]


def test_a_publish_during_the_workers_prefill_stops_the_call_after_one_token():
    # call 1 (group 0, 1 token): prefill 0-1, a step to 2; step 1 trains 2-3.5 and publishes version 1 while
    # call 2 (group 1, 4 tokens, version 0, prefilled 2-3) decodes: the publish at 3.5 stops it after the token in
    # progress, at 4; the row goes on under version 1: prefill 11 tokens 4-5.1, 3 steps to 8.1; step 2 to 9.6
    costs = {"decode_step_s": 1.0, "prefill_token_s": 0.1, "train_fixed_s": 1.5}
    mode = _async(engine="static", max_batch=1, partial_rollout=True)
    res = simulate(_scenario([mode], [[1], [4]], costs, steps=2))[0]
    assert [r.end for r in res.records] == pytest.approx([3.5, 8.1 + 1.5])
    assert [r.interrupted for r in res.records] == [0, 1]
    # the prefill case: a train step shorter than the prefill publishes mid-prefill; the call decodes one token
    costs_short = {"decode_step_s": 1.0, "prefill_token_s": 0.1, "train_fixed_s": 0.5}
    # call 1 (1 token) 0-2; step 1 trains 2-2.5; call 2 prefills 2-3 (the publish at 2.5 lands here), decodes one
    # token 3-4, takes version 1, prefills 11 tokens 4-5.1 and decodes 3 tokens to 8.1
    res = simulate(_scenario([mode], [[1], [4]], costs_short, steps=2))[0]
    assert [r.end for r in res.records] == pytest.approx([2.5, 8.6])
    assert [r.interrupted for r in res.records] == [0, 1]


def test_old_log_probs_recompute_is_charged_per_trained_token_and_rollout_skips_it():
    costs = {"decode_step_s": 0.01, "train_fixed_s": 1.0, "train_token_s": 0.01, "logprob_token_s": 0.004}
    groups = [[10, 10]]
    base = {"mode": "sync", "devices": 1, "max_batch": 8}
    res = simulate(_scenario([{**base, "name": "recompute"}, {**base, "name": "mu", "old_log_probs": "rollout"}],
                             groups, costs, steps=2, G=2))
    tokens = 2 * (10 + 10)  # 2 rows padded to prompt + longest
    assert [r.train_s for r in res[0].records] == pytest.approx([1.0 + 0.01 * tokens + 0.004 * tokens] * 2)
    assert [r.logprob_s for r in res[0].records] == pytest.approx([0.004 * tokens] * 2)
    assert [r.train_s for r in res[1].records] == pytest.approx([1.0 + 0.01 * tokens] * 2)
    assert res[1].step_time_s == pytest.approx(0.1 + 1.0 + 0.01 * tokens)


def test_partial_off_gives_the_numbers_of_the_simulator_before_it():
    # float.hex of each mode's step time, summed step ends and idle time, computed with the simulator at commit
    # 7acc6a5 (before partial rollout and old_log_probs existed) on this scenario
    lengths = {"kind": "lognormal", "median": 300, "sigma_prompt": 1.0, "sigma_response": 0.3, "max_len": 8192,
               "prompt_len": 64}
    costs = {"decode_step_s": 0.01, "decode_seq_s": 1e-4, "decode_ctx_s": 2e-8, "prefill_s": 0.05,
             "prefill_token_s": 1e-5, "train_fixed_s": 1.0, "train_token_s": 1e-5, "sync_s": 0.3,
             "reward_sample_s": 0.001}
    modes = [{"name": "sync", "mode": "sync", "devices": 4, "max_batch": 64},
             {"name": "static", "mode": "sync", "devices": 2, "engine": "static", "max_batch": 0},
             {"name": "tail", "mode": "tail_batching", "devices": 4, "max_batch": 64},
             {"name": "async", "mode": "async", "placement": "disaggregated", "rollout_devices": 3,
              "train_devices": 1, "dispatch": "queue", "staleness": 1, "max_batch": 64},
             {"name": "async0", "mode": "async", "placement": "disaggregated", "rollout_devices": 2,
              "train_devices": 2, "staleness": 0, "max_batch": 16, "partial_rollout": False,
              "old_log_probs": "recompute"}]
    scn = scenario_from_dict({"steps": 10, "seed": 5, "costs": costs, "modes": modes,
                              "workload": {"prompts_per_step": 8, "group_size": 4, "lengths": lengths}})
    before = {"sync": ("0x1.8769c6a37090ap+4", "0x1.5e970da79de95p+10", "0x1.59ce7a7e29038p+3", 0),
              "static": ("0x1.c295bf66d518bp+4", "0x1.946759bcdfc4fp+10", "0x1.935c3cb0a43c3p+2", 0),
              "tail": ("0x1.2bdb08bc5e8cfp+4", "0x1.8aa67c01ae2afp+9", "0x1.5a336228d03f6p+2", 137),
              "async": ("0x1.04cb86ce5d3d2p+3", "0x1.a56d228d1db55p+8", "0x1.a1762ef2ff086p+0", 52),
              "async0": ("0x1.8ba93a61835b2p+4", "0x1.622341727b9d8p+10", "0x1.a72053a44a800p+3", 0)}
    for r in simulate(scn):
        got = (r.step_time_s.hex(), sum(x.end for x in r.records).hex(), r.idle_s.hex(), r.stats["aborted"])
        assert got == before[r.name], r.name


def test_partial_rollout_and_old_log_probs_keys_are_checked():
    groups = [[2]]
    for mode, needle in [(_async(partial_rollout="yes"), "partial_rollout = 'yes'"),
                         ({"mode": "sync", "devices": 1, "partial_rollout": True}, "modelled for mode async only"),
                         (_async(old_log_probs="mu"), "old_log_probs = 'mu'"),
                         (_async(engine="static", max_batch=0), "credo's overlap worker"),
                         (_async(engine="static", dispatch="queue"), "credo's overlap worker")]:
        with pytest.raises(ValueError, match=needle):
            _scenario([mode], groups, COSTS, steps=1)


def test_validate_maps_an_overlap_recipe_onto_the_worker_model():
    from credo.config import load_recipe
    from credo.simulate.costs import Costs
    from credo.simulate.validate import _mode_spec

    r = load_recipe("recipes/longtail.yaml", ["stages.schedule=overlap", "algo.old_log_probs=rollout",
                                              "stages.schedule_kwargs={max_staleness: 2, partial_rollout: true, "
                                              "request_prompts: 1}"])
    spec = _mode_spec(r, Costs(), "async")
    assert (spec.mode, spec.placement, spec.rollout_devices, spec.train_devices, spec.engine) == \
        ("async", "disaggregated", 1, 1, "static")
    assert (spec.max_batch, spec.staleness, spec.partial_rollout, spec.old_log_probs) == (4, 2, True, "rollout")
    plain = _mode_spec(load_recipe("recipes/longtail.yaml", ["stages.schedule=overlap"]), Costs(), "async")
    assert (plain.max_batch, plain.staleness, plain.partial_rollout, plain.old_log_probs) == (64, 1, False, "recompute")
    assert _mode_spec(load_recipe("recipes/longtail.yaml", []), Costs(), "sync").old_log_probs == "rollout"
    with pytest.raises(ValueError, match="models stages.schedule: overlap"):
        _mode_spec(load_recipe("recipes/longtail.yaml", []), Costs(), "async")


def test_validate_runs_an_overlap_run_against_the_model(tmp_path):
    import json

    from credo.simulate.validate import validate

    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    with open(run / "metrics.jsonl", "w") as f:
        for step in (1, 2, 3):
            f.write(json.dumps({"step": step, "perf/step_time_s": 2.0, "perf/rollout_s": 0.5, "perf/reward_s": 0.0,
                                "perf/logprob_s": 0.1, "perf/update_s": 1.0, "perf/sync_s": 0.0}) + "\n")
            with open(run / "rollouts" / f"step_{step}.jsonl", "w") as d:
                for g in range(16):
                    for n in (10, 20 + g, 30, 5 * step):
                        d.write(json.dumps({"step": step, "index": 0, "group_id": g, "prompt_ids": [7] * 12,
                                            "response_ids": [9] * n}) + "\n")
    costs = tmp_path / "costs.yaml"
    costs.write_text("costs: {decode_step_s: 0.01, train_token_s: 0.0005, logprob_token_s: 0.0002}\n")
    out = validate("recipes/longtail.yaml", str(run), str(costs), lengths_from=str(run), mode="async",
                   overrides=["stages.schedule=overlap", "stages.schedule_kwargs={max_staleness: 1, "
                              "partial_rollout: true}"])
    assert "mode async" in out and "measured mean 2.000 s, simulated" in out
