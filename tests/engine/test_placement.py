"""Placement: layouts, and refusing what a Ray cluster cannot grant (before launch)."""

import pytest

from engine.api import LogEvent, RunStatusEvent, run_local
from engine.config import (
    ColocatedPlacementConfig,
    ConfigError,
    DisaggregatedPlacementConfig,
    validate_config,
)
from engine.orchestration.placement import PlacementError, check_fits, layout_for, reserve
from engine.telemetry.sinks import MemorySink

from .conftest import small_run


def test_disaggregated_layout_gives_each_role_its_own_bundle_and_devices():
    lay = layout_for(DisaggregatedPlacementConfig(rollout_workers=2, devices_per_worker=2,
                                                  learner_devices=1, strategy="SPREAD"))
    assert lay.bundles == [{"GPU": 2.0}, {"GPU": 2.0}, {"GPU": 1.0}]
    assert [w.devices for w in lay.workers] == [["gpu:0", "gpu:1"], ["gpu:2", "gpu:3"]]
    assert (lay.learner.bundle, lay.learner.devices) == (2, ["gpu:4"])
    assert lay.devices == [f"gpu:{i}" for i in range(5)] and lay.on_ray


def test_colocated_on_ray_shares_each_bundle_between_rollout_and_learner():
    lay = layout_for(ColocatedPlacementConfig(devices=2, ray=True))
    assert lay.bundles == [{"GPU": 1.0}] * 2
    assert [(w.bundle, w.gpus) for w in lay.workers] == [(0, 0.5), (1, 0.5)]
    assert (lay.learner.bundle, lay.learner.gpus) == (0, 0.5)
    assert lay.devices == ["gpu:0", "gpu:1"]


def test_colocated_in_process_needs_no_ray():
    lay = layout_for(ColocatedPlacementConfig(devices=2))
    assert not lay.on_ray and lay.bundles == []
    assert lay.rollout == lay.learner.devices == ["cpu:0", "cpu:1"]


def test_asking_more_gpus_than_the_cluster_has_names_both():
    lay = layout_for(DisaggregatedPlacementConfig(rollout_workers=7))
    with pytest.raises(PlacementError) as err:
        check_fits(lay, [{"CPU": 2.0, "GPU": 4.0}])
    assert "asks for 8 GPUs in 8 bundles" in str(err.value)
    assert "the cluster has 4 GPUs" in str(err.value)


def test_strict_pack_must_fit_one_node():
    lay = layout_for(DisaggregatedPlacementConfig(rollout_workers=2, strategy="STRICT_PACK"))
    with pytest.raises(PlacementError, match="STRICT_PACK needs them all on one node"):
        check_fits(lay, [{"GPU": 2.0}, {"GPU": 2.0}])
    check_fits(layout_for(DisaggregatedPlacementConfig(rollout_workers=2)),
               [{"GPU": 2.0}, {"GPU": 2.0}])                          # PACK may split


def test_a_bundle_larger_than_any_node_is_refused():
    lay = layout_for(DisaggregatedPlacementConfig(devices_per_worker=3))
    with pytest.raises(PlacementError, match="a bundle is larger than any node"):
        check_fits(lay, [{"GPU": 2.0}, {"GPU": 2.0}])


@pytest.mark.parametrize("placement, fix, fits", [
    ({"type": "disaggregated", "devices_per_worker": 1},
     r"tensor_parallel_size=2.*placement.devices_per_worker=1.*devices_per_worker >= 2",
     {"type": "disaggregated", "devices_per_worker": 2}),
    ({"type": "colocated", "ray": True},
     r"tensor_parallel_size=2.*placement.ray = true.*devices_per_worker >= 2", None),
    ({"type": "colocated", "devices": 1}, r"placement.devices=1; set placement.devices >= 2",
     {"type": "colocated", "devices": 2}),
])
def test_a_rollout_worker_must_hold_its_tensor_parallel_ranks(placement, fix, fits):
    def cfg(p):
        on_ray = p["type"] == "disaggregated" or p.get("ray", False)
        return {"rollout": {"type": "vllm", "tensor_parallel_size": 2}, "placement": p,
                "weight_sync": {"type": "shm"} if on_ray else {}}

    with pytest.raises(ConfigError, match=fix):
        validate_config(cfg(placement))
    if fits is not None:
        validate_config(cfg(fits))


def test_the_transport_must_match_where_the_rollout_engine_lives():
    with pytest.raises(ConfigError) as err:
        validate_config({"placement": {"type": "disaggregated"}})
    assert err.value.errors[0][0] == "weight_sync.type"
    assert '"object_store"' in err.value.errors[0][1]
    validate_config({"placement": {"type": "colocated", "ray": True},
                     "weight_sync": {"type": "shm"}})


# --------------------------------------------------------------------------- real Ray

@pytest.mark.slow
def test_spread_places_bundles_on_two_nodes_of_a_multi_node_cluster(no_local_ray):
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    from ray.util.placement_group import placement_group_table, remove_placement_group

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 1})
    cluster.add_node(num_cpus=1, num_gpus=1)
    ray.init(address=cluster.address)
    try:
        cluster.wait_for_nodes()
        lay = layout_for(DisaggregatedPlacementConfig(strategy="SPREAD"))
        pg = reserve(lay, timeout_s=30)
        nodes = set(placement_group_table(pg)["bundles_to_node_id"].values())
        assert len(nodes) == 2
        remove_placement_group(pg)
        strict = layout_for(DisaggregatedPlacementConfig(strategy="STRICT_PACK"))
        with pytest.raises(PlacementError, match="per node: 1, 1"):
            reserve(strict, timeout_s=30)
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.mark.slow
def test_an_infeasible_run_is_refused_before_any_actor_starts(ray_gpus, tmp_path,
                                                              model_cache):
    cfg = small_run(placement={"type": "disaggregated", "rollout_workers": 7},
                    weight_sync={"type": "object_store"})
    sink = MemorySink()
    with pytest.raises(PlacementError, match="asks for 8 GPUs .* the cluster has 4 GPUs"):
        run_local(cfg, tmp_path, sink=sink)
    errors = [e.message for e in sink.events if isinstance(e, LogEvent) and e.level == "error"]
    assert any("asks for 8 GPUs" in m for m in errors)
    assert [e.status for e in sink.events if isinstance(e, RunStatusEvent)][-1] == "failed"
    assert ray_gpus.available_resources().get("GPU") == 4.0    # nothing left behind


@pytest.mark.slow
def test_a_grant_that_never_comes_times_out_with_what_is_free(ray_gpus):
    from ray.util.placement_group import placement_group, remove_placement_group

    hog = placement_group([{"GPU": 3.0}])
    ray_gpus.get(hog.ready())
    try:
        lay = layout_for(DisaggregatedPlacementConfig(devices_per_worker=1, learner_devices=1))
        with pytest.raises(PlacementError, match="did not grant .* within 1 s"):
            reserve(lay, timeout_s=1.0)
    finally:
        remove_placement_group(hog)


@pytest.mark.parametrize(("placement", "bundle", "device"), [
    (DisaggregatedPlacementConfig(rollout_workers=2, critic_devices=1), 3, "gpu:3"),
    (ColocatedPlacementConfig(devices=2, ray=True, critic_devices=1), 2, "gpu:2"),
])
def test_a_critic_of_its_own_adds_a_bundle_and_a_device_that_counts_in_bubble(
        placement, bundle, device):
    lay = layout_for(placement)
    assert len(lay.bundles) == bundle + 1 and lay.bundles[bundle] == {"GPU": 1.0}
    assert (lay.critic.bundle, lay.critic.gpus, lay.critic.devices) == (bundle, 1, [device])
    assert lay.devices[-1] == device and lay.trainers == [*lay.learner.devices, device]
    assert layout_for(ColocatedPlacementConfig(devices=2, ray=True)).critic is None
