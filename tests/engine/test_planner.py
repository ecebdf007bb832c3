"""The what-if planner: known answers on hand-made traces, the fit, the CLI."""

from dataclasses import replace

import numpy as np
import pytest

from engine.api import MetricsEvent, PlanError, plan_run, run_local
from engine.cli import main
from engine.config import (
    ColocatedPlacementConfig,
    DisaggregatedPlacementConfig,
    FullyAsyncPolicyConfig,
    OneStepOffPolicyConfig,
    PartialRolloutPolicyConfig,
    SyncPolicyConfig,
)
from engine.planner import (
    LengthModel,
    PlanInputs,
    Shape,
    fit_run,
    fit_run_dir,
    plan_table,
    simulate,
)
from engine.telemetry.sinks import MemorySink

from .conftest import small_run

N, G, L = 4, 2, 10
ONE_PLUS_ONE = DisaggregatedPlacementConfig(rollout_workers=1, learner_devices=1)


def fixed(**costs) -> PlanInputs:
    """Every response exactly L tokens; round costs so the answers are exact."""
    base = dict(prompts_per_step=N, group_size=G, max_new_tokens=L,
                lengths=LengthModel((0.0, 1.0), (L, L)), prefill_s=0.5, decode_step_s=0.1,
                decode_row_s=0.0125, reward_sample_s=0.25, learner_step_s=1.0,
                learner_token_s=0.0125, sync_send_s=0.25, sync_recv_s=0.5)
    return PlanInputs(**(base | costs))


def test_a_sync_loop_with_fixed_costs_runs_its_phases_in_sequence():
    inp = fixed()
    gen = 0.5 + 0.1 * L + 0.0125 * N * G * L + 0.25 * N * G     # 1.5 + 1 + 2 = 4.5
    learner = 1.0 + 0.0125 * N * G * L                            # 2.0
    step = gen + learner + 0.25 + 0.5 + 0.75                      # + send, recv, overhead
    p = simulate(inp, ONE_PLUS_ONE, SyncPolicyConfig(), loop_overhead_s=0.75)
    assert p.step_s == pytest.approx(step)
    assert p.samples_per_s == pytest.approx(N * G / step)
    busy = (gen + 0.5) + (learner + 0.25)                         # worker + learner device
    assert p.bubble == pytest.approx(1 - busy / (2 * step))
    assert p.rollout_share == pytest.approx(gen / step)
    assert p.staleness == {0: 1.0} and p.dropped_per_step == 0


def period(inp: PlanInputs, policy) -> float:
    """The steady step time: the pipeline's fill cancels between a short and a long run."""
    short, long = (simulate(inp, ONE_PLUS_ONE, policy, steps=k) for k in (11, 31))
    return (long.step_s * 30 - short.step_s * 10) / 20


def test_one_step_off_takes_the_slower_side_of_the_overlap():
    gen_side = 4.5 + 0.5                                          # generate + reward, receive
    learner_bound = fixed(learner_step_s=6.0)                     # learner side 7.0 + 0.25
    assert period(learner_bound, OneStepOffPolicyConfig()) == pytest.approx(7.0 + 0.25)
    assert period(fixed(), OneStepOffPolicyConfig()) == pytest.approx(gen_side)
    assert simulate(fixed(), ONE_PLUS_ONE, OneStepOffPolicyConfig()).staleness == {1: 1.0}


def test_in_the_drivers_process_nothing_overlaps():
    serial = ColocatedPlacementConfig(devices=2)
    sync = simulate(fixed(), serial, SyncPolicyConfig())
    off = simulate(fixed(), serial, OneStepOffPolicyConfig())
    assert off.samples_per_s == pytest.approx(sync.samples_per_s)
    assert sync.bubble == pytest.approx(0.0)


def test_actors_that_slow_each_other_stretch_only_the_time_they_overlap():
    """One-step-off on the generation-bound recipe (generation side 5.0 s, learner 2.0 s):
    the learner 1.5x slower beside generation still fits under it (3.0 s), generation 1.2x
    slower in the share of its time the learner runs beside it (about 2/5) sets the
    period; sync and the driver's process overlap nothing."""
    slow = replace(fixed(), corun_learner=1.5, corun_rollout=1.2)
    assert simulate(slow, ONE_PLUS_ONE, SyncPolicyConfig()).step_s == pytest.approx(
        simulate(fixed(), ONE_PLUS_ONE, SyncPolicyConfig()).step_s)
    base, stretched = period(fixed(), OneStepOffPolicyConfig()), period(
        slow, OneStepOffPolicyConfig())
    assert base < stretched < base * 1.2
    serial = ColocatedPlacementConfig(devices=2)            # nothing overlaps there
    assert simulate(slow, serial, OneStepOffPolicyConfig()).step_s == pytest.approx(
        simulate(fixed(), serial, OneStepOffPolicyConfig()).step_s)


def test_the_fit_takes_the_probed_slowdown_and_undoes_it_where_the_run_overlapped():
    truth = fixed(reward_sample_s=0.0)
    cfg = small_run(rollout={"prompts_per_step": N, "max_new_tokens": 64},
                    algorithm={"group_size": G},
                    placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    probe = {"host/corun_slowdown/learner": 1.5, "host/corun_slowdown/rollout": 1.25}
    rows = [m | probe for m in trace(truth, [(9, 9), (10, 40), (30, 60), (12, 80),
                                             (50, 100), (20, 30)])]
    seq = fit_run(cfg, rows).inputs                  # no spans: nothing seen overlapping
    assert (seq.corun_learner, seq.corun_rollout) == (1.5, 1.25)
    assert seq.learner_token_s == pytest.approx(truth.learner_token_s)

    class Span:
        def __init__(self, phase, start, end, step):
            self.phase, self.start, self.end, self.step = phase, start, end, step
            self.device = "gpu:1" if phase == "learner" else "gpu:0"

    # every learner span entirely beside generation: its costs were 1.5x stretched
    spans = [Span(p, 10.0 * k, 10.0 * k + 4, k) for k in range(6)
             for p in ("learner", "rollout")]
    over = fit_run(cfg, rows, spans).inputs
    assert over.learner_token_s == pytest.approx(truth.learner_token_s / 1.5)
    assert over.decode_row_s == pytest.approx(truth.decode_row_s / 1.25)


def longtail() -> PlanInputs:
    """Most answers short, a few near the budget; a prompt's rows alike; a decode step
    costs about the same for 1 row as for 64 (a GPU batch)."""
    return fixed(max_new_tokens=200, prompts_per_step=16, group_size=4,
                 lengths=LengthModel((0.0, 0.8, 0.97, 1.0), (2.0, 10.0, 60.0, 200.0), 1.0),
                 prefill_s=0.01, decode_step_s=0.02, decode_row_s=0.0001,
                 reward_sample_s=0.0, learner_step_s=0.5, learner_token_s=0.0001,
                 sync_send_s=0.01, sync_recv_s=0.01)


@pytest.mark.parametrize("overlap", [True, False])
def test_on_a_long_tail_partial_rollout_beats_sync_within_its_staleness_bound(overlap):
    cfg = PartialRolloutPolicyConfig(overlap=overlap, max_staleness=2 if overlap else 1)
    sync = simulate(longtail(), ONE_PLUS_ONE, SyncPolicyConfig(), steps=40)
    partial = simulate(longtail(), ONE_PLUS_ONE, cfg, steps=40)
    assert partial.samples_per_s > 1.3 * sync.samples_per_s
    assert partial.staleness_max <= cfg.staleness_bound and partial.recycled_per_step > 0


@pytest.mark.parametrize("on_stale", ["wait", "drop"])
def test_fully_async_keeps_every_trained_sample_within_its_bound(on_stale):
    cfg = FullyAsyncPolicyConfig(max_staleness=1, on_stale=on_stale, prompts_per_call=4)
    p = simulate(longtail(), Shape("4+1", 4, 1, 5), cfg, steps=30)
    assert p.staleness_max <= 1


def test_waiting_on_one_worker_drops_nothing_but_out_of_order_workers_can():
    """"wait" plans each call's training step assuming calls finish in order; one worker's
    do, but a long call on one of four finishes after later ones and its groups age past
    the bound in the FIFO buffer (the engine's ExperienceBuffer drops them too)."""
    cfg = FullyAsyncPolicyConfig(max_staleness=1, on_stale="wait", prompts_per_call=4)
    one = simulate(longtail(), ONE_PLUS_ONE, cfg, steps=30)
    four = simulate(longtail(), Shape("4+1", 4, 1, 5), cfg, steps=30)
    assert one.dropped_per_step == 0 and one.staleness_max <= 1
    assert four.dropped_per_step > 0


def trace(inp: PlanInputs, steps: list[tuple[int, int]]) -> list[dict[str, float]]:
    """Step metrics a one-worker sync run with ``inp``'s costs reports, for steps of
    (longest response, tokens)."""
    rows = []
    for longest, tokens in steps:
        rollout = inp.generate_s(longest, tokens)
        learner = inp.learner_s(tokens, 1)
        step = rollout + learner + 0.3
        rows.append({"time/step_s": step, "time/rollout_s": rollout, "time/reward_s": 0.0,
                     "time/learner_s": learner, "time/weight_sync_s": 0.3,
                     "throughput/tokens_per_s": tokens / step, "response_length/max": longest,
                     "response_length/p50": tokens / (N * G), "response_length/p99": longest})
    return rows


def test_the_fit_recovers_the_costs_a_trace_was_made_with():
    truth = fixed(reward_sample_s=0.0)
    cfg = small_run(rollout={"prompts_per_step": N, "max_new_tokens": 64},
                    algorithm={"group_size": G},
                    placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    rows = trace(truth, [(9, 9), (10, 40), (30, 60), (12, 80), (50, 100), (20, 30)])
    fit = fit_run(cfg, rows)
    got = fit.inputs
    assert got.prefill_s == pytest.approx(truth.prefill_s)
    assert got.decode_step_s == pytest.approx(truth.decode_step_s)
    assert got.decode_row_s == pytest.approx(truth.decode_row_s)
    assert got.learner_step_s == pytest.approx(truth.learner_step_s)
    assert got.learner_token_s == pytest.approx(truth.learner_token_s)
    assert fit.loop_overhead_s == pytest.approx(0.0, abs=1e-9)
    assert fit.steps == 5                                       # the first step left out


def test_a_multi_turn_runs_environment_time_is_fitted_as_its_own_phase_and_planned():
    """Environment time is a phase of each generate call: fitted from time/env_s, not
    left in the loop overhead, and planned per call whatever the worker count (its
    rounds are concurrent over a call's rows)."""
    truth = fixed(reward_sample_s=0.0)
    cfg = small_run(rollout={"prompts_per_step": N, "max_new_tokens": 64},
                    algorithm={"group_size": G},
                    placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    rows = trace(truth, [(9, 9), (10, 40), (30, 60), (12, 80), (50, 100), (20, 30)])
    for m in rows:                              # each step 0.7 s longer, in the env
        tokens = m["throughput/tokens_per_s"] * m["time/step_s"]
        m["time/env_s"], m["time/step_s"] = 0.7, m["time/step_s"] + 0.7
        m["throughput/tokens_per_s"] = tokens / m["time/step_s"]
    fit = fit_run(cfg, rows)
    assert fit.inputs.env_call_s == pytest.approx(0.7)
    assert fit.loop_overhead_s == pytest.approx(0.0, abs=1e-9)
    assert fit.inputs.learner_step_s == pytest.approx(truth.learner_step_s)
    without = simulate(replace(fit.inputs, env_call_s=0.0), ONE_PLUS_ONE, SyncPolicyConfig())
    planned = simulate(fit.inputs, ONE_PLUS_ONE, SyncPolicyConfig())
    assert planned.step_s - without.step_s == pytest.approx(0.7)
    two = Shape("2+1", 2, 1, 3)
    assert simulate(fit.inputs, two, SyncPolicyConfig()).step_s - simulate(
        replace(fit.inputs, env_call_s=0.0), two, SyncPolicyConfig()).step_s \
        == pytest.approx(0.7)


def test_a_long_run_is_planned_from_its_latest_steps_as_from_all_of_them():
    """plan_run gathers only the steps the fit reads (the last MAX_FIT_STEPS timed ones
    past the first): the same table as the fit over every step."""
    from engine.planner import fit_run, plan_table
    from engine.planner.fit import MAX_FIT_STEPS

    cfg = small_run(placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    shapes = [(9 + i % 40, 10 + (7 * i) % 90) for i in range(3 * MAX_FIT_STEPS)]
    rows = trace(fixed(reward_sample_s=0.0), shapes)
    rows[-1].pop("time/learner_s")          # an untimed step among them: not read
    series = {k: {i: m[k] for i, m in enumerate(rows) if k in m} for k in rows[0]}
    series["reward/mean"] = {i: 0.5 for i in range(len(rows) + 5)}   # steps past the timed

    got = plan_run(cfg, series)
    whole = plan_table(fit_run(cfg, rows[:-1], [], list(range(len(rows) - 1))), cfg)
    assert got.rows == whole.rows and got.current == whole.current


def test_a_run_without_a_timed_step_cannot_be_planned():
    with pytest.raises(PlanError, match="no step with timings"):
        plan_run(small_run(), {"reward/mean": {0: 0.5}})


def test_a_thousand_devices_plan_every_placement_and_policy():
    cfg = small_run(placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    metrics = trace(fixed(reward_sample_s=0.0), [(9, 9), (10, 40), (30, 60)])
    table = plan_run(cfg, {k: {i: m[k] for i, m in enumerate(metrics)} for k in metrics[0]},
                     devices=1024)
    placements = {r.placement for r in table.rows}
    assert "colocated 1024" in placements and "disaggregated 512+512" in placements
    assert {r.policy for r in table.rows} == {"sync", "one_step_off", "fully_async",
                                              "partial_rollout"}
    assert table.best.samples_per_s >= table.current.samples_per_s


def test_a_row_for_another_config_matches_its_layout_and_policy_type_not_its_label():
    cfg = small_run(placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    metrics = trace(fixed(reward_sample_s=0.0), [(9, 9), (10, 40), (30, 60)])
    table = plan_run(cfg, {k: {i: m[k] for i, m in enumerate(metrics)} for k in metrics[0]})

    assert table.row_for(cfg) == (table.current, "")
    async_cfg = cfg.model_copy(update={"async_policy": OneStepOffPolicyConfig()})
    row, why = table.row_for(async_cfg)
    assert (row.placement, row.policy, why) == ("disaggregated 1+1", "one_step_off", "")
    on_ray = cfg.model_copy(update={"placement": ColocatedPlacementConfig(devices=2, ray=True)})
    assert table.row_for(on_ray)[0].placement == "colocated 2"
    assert table.row_for(small_run()) == (
        None, "no row for colocated 1 (in process) under sync "
              "(it plans 2 devices)")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, model_cache):
    out = tmp_path_factory.mktemp("planned")
    sink = MemorySink()
    run_local(small_run(steps=4, telemetry={"corun_probe_s": 0.05}), out, sink=sink)
    return out, sink


def test_a_real_run_directory_fits_and_plans(run_dir):
    out, sink = run_dir
    fit = fit_run_dir(out)
    assert fit.steps == 3 and fit.policy == "sync"
    lengths = fit.inputs.lengths
    assert 1 <= lengths.lengths[0] <= lengths.lengths[-1] <= 4
    steps = [e.values for e in sink.of_type(MetricsEvent) if "time/step_s" in e.values]
    assert all("response_length/group_max_mean" in m and "response_length/p90" in m
               for m in steps)
    # in the driver's process nothing runs beside anything: no co-run probe
    assert not any(k.startswith("host/corun_slowdown/") for m in steps for k in m)
    assert fit.inputs.learner_step_s + fit.inputs.learner_token_s > 0
    cfg = small_run(steps=4)
    table = plan_table(fit, cfg, devices=4)
    assert table.current.placement.endswith("(this run)") and len(table.rows) == 1 + 4 * 4


def test_the_cli_prints_the_plan_of_a_run_directory(run_dir, capsys):
    assert main(["plan", str(run_dir[0]), "--devices", "8"]) == 0
    out = capsys.readouterr().out
    assert "on 8 devices" in out and "disaggregated 4+4" in out and "best:" in out
    for policy in ("sync", "one_step_off", "fully_async", "partial_rollout"):
        assert policy in out


def test_the_cli_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert main(["plan", str(tmp_path)]) == 2
    assert "config.toml is missing" in capsys.readouterr().err


def test_fitted_lengths_reproduce_the_mean_and_the_group_max_the_run_reported():
    import numpy as np

    from engine.planner.fit import fit_lengths

    quantiles = dict(zip(("min", "p10", "p25", "p50", "p75", "p90", "p95", "p99", "max"),
                         (1, 2, 2.2, 3.6, 9.25, 21.4, 30.3, 43.6, 46), strict=True))
    row = {f"response_length/{k}": v for k, v in quantiles.items()}
    row |= {"response_length/mean": 7.1, "response_length/group_max_mean": 20.0}
    model = fit_lengths([row], group_size=8, budget=49)
    assert model.curve > 1                        # a long tail: the mass sits low
    assert model.mean == pytest.approx(7.1, rel=1e-3)
    drawn = model.sample_groups(np.random.default_rng(1), 4000, 8, 49)
    assert drawn.mean() == pytest.approx(7.1, rel=0.05)
    assert drawn.max(1).mean() == pytest.approx(20.0, rel=0.05)


def test_fitted_lengths_pool_the_steps_rows_so_a_long_steps_tail_survives():
    """Steps of short answers (all 10 tokens) and of long ones (30 to 40): half the run's
    rows are past 30. Averaging the steps' quantiles would put every row near 20-25."""
    from engine.planner.fit import fit_lengths

    short = {f"response_length/{k}": 10.0 for k in ("min", "p50", "p99", "max")}
    long = dict(zip((f"response_length/{k}" for k in ("min", "p50", "p99", "max")),
                    (30.0, 35.0, 39.9, 40.0), strict=True))
    model = fit_lengths([short, long] * 3, group_size=4, budget=64)
    drawn = model.tokens_at(np.random.default_rng(0).random(20_000))
    assert (drawn <= 10.5).mean() == pytest.approx(0.5, abs=0.02)
    assert (drawn >= 35).mean() == pytest.approx(0.25, abs=0.02)    # half the long rows
    assert max(model.lengths) == 40.0


def test_a_step_a_hiccup_slowed_does_not_set_the_cost_of_every_step():
    truth = fixed(reward_sample_s=0.0)
    cfg = small_run(rollout={"prompts_per_step": N, "max_new_tokens": 64},
                    algorithm={"group_size": G},
                    placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    rows = trace(truth, [(9, 9), (10, 40), (30, 60), (12, 80), (50, 100), (20, 30),
                         (25, 50), (40, 70)])
    for r, noise in zip(rows, (1.0, 1.01, 0.99, 1.8, 0.98, 1.02, 1.0, 0.99), strict=True):
        r["time/learner_s"] *= noise              # a step's own noise; step 3 stalled (GC)
    got = fit_run(cfg, rows).inputs
    per_step = [got.learner_s(t, 1) / truth.learner_s(t, 1) for t in (30, 60, 100)]
    assert per_step == pytest.approx([1.0] * 3, abs=0.04)   # 24 % off with the stall


def test_a_learner_costlier_per_token_on_bigger_batches_is_fitted_to_the_runs_total():
    """Per-token cost that grows with the batch (longer packed rows) and no fixed part: a
    line through the origin fitted by plain least squares follows the biggest steps and
    charges every step more than the run spent; weighting each step by 1 / its tokens
    makes the line's total the run's."""
    cfg = small_run(rollout={"prompts_per_step": N, "max_new_tokens": 64},
                    algorithm={"group_size": G},
                    placement=ONE_PLUS_ONE.model_dump(), weight_sync={"type": "shm"})
    tokens = [60, 500, 800, 1100, 1400, 1700, 2000, 2300, 2600]
    rows = trace(fixed(reward_sample_s=0.0), [(20, t) for t in tokens])
    for r, t in zip(rows, tokens, strict=True):
        r["time/learner_s"] = 3e-4 * t + 1e-7 * t * t
    got = fit_run(cfg, rows).inputs
    used = rows[1:]                                   # the first step left out
    spent = sum(r["time/learner_s"] for r in used)
    fitted = sum(got.learner_s(r["throughput/tokens_per_s"] * r["time/step_s"], 1)
                 for r in used)
    assert fitted == pytest.approx(spent, rel=0.01)


def test_a_carried_row_feeds_its_tokens_again_under_the_new_weights():
    """Partial rollout continues a row under newer weights than made its cache: the call
    feeds its tokens so far again, at what a decoded token costs."""
    from engine.planner.model import _Loop, shape_of

    inp = fixed(decode_step_s=0.0, prefill_s=0.0, reward_sample_s=0.0,
                lengths=LengthModel((0.0, 1.0), (2.0, 2.0)), max_new_tokens=64)
    loop = _Loop(inp, shape_of(ONE_PLUS_ONE), seed=0)
    group = loop.fresh(1)[0]
    group.rem[:] = 10                                  # both rows: 10 tokens to make
    half = loop.call(0, 0.0, [group], target=None)
    assert half.end == pytest.approx(inp.decode_row_s * 20)
    carried = replace(half.complete[0], rem=np.full(2, 5), done=np.zeros(2, dtype=bool))
    again = loop.call(0, half.end, [carried], target=None)
    assert again.end - half.end == pytest.approx(inp.decode_row_s * (2 * 5 + 2 * 10))
