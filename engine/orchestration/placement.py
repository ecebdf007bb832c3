"""Where the run's actors go: bundles, which actor sits on which, and the logical devices.

    colocated, devices=2, in process (ray = false):
        cpu:0 cpu:1   [rollout | reward | learner | sync]       (roles take turns)
    colocated, devices=2, on Ray:      bundle 0 {GPU: 1}        bundle 1 {GPU: 1}
        gpu:0  rollout worker 0 (0.5) + learner (0.5)      gpu:1  rollout worker 1 (0.5)
    disaggregated, rollout_workers=2, devices_per_worker=1, learner_devices=1:
        bundle 0 {GPU: 1}  gpu:0  rollout worker 0
        bundle 1 {GPU: 1}  gpu:1  rollout worker 1
        bundle 2 {GPU: 1}  gpu:2  learner
    disaggregated, rollout_workers=1, learner_devices=2 (an FSDP2-sharded learner):
        bundle 0 {GPU: 1}  gpu:0  rollout worker 0
        bundle 1 {GPU: 2}  gpu:1  learner rank 0     gpu:2  learner rank 1
    any Ray placement with critic_devices=1 (PPO): one bundle more, after the others
        disaggregated, rollout_workers=1:   ... bundle 1 gpu:1 learner   bundle 2 gpu:2 critic
        colocated, devices=2, on Ray:       ... bundle 2 {GPU: 1}  gpu:2  critic

Device names number the placement's devices (gpu:<k>), not the node's. Spans are recorded
per logical device, so bubble and utilization mean the same on a CPU slot, a logical GPU
(``ray.init(num_gpus=N)`` on a CPU box) or a real GPU. A placement that cannot fit the
cluster is refused before anything launches (PlacementError: asked vs available).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from engine.config import ColocatedPlacementConfig, DisaggregatedPlacementConfig


class PlacementError(RuntimeError):
    """The placement cannot be granted by this cluster."""


@dataclass(frozen=True)
class Slot:
    bundle: int            # index into Layout.bundles
    gpus: float            # of that bundle's GPUs this actor takes
    devices: list[str]


@dataclass(frozen=True)
class Layout:
    workers: list[Slot]    # one per rollout worker
    learner: Slot
    bundles: list[dict[str, float]]
    strategy: str
    on_ray: bool
    learner_ranks: int = 1     # processes of the learner: one per device when sharded
    critic: Slot | None = None  # PPO's critic on a bundle of its own; None: in the learner

    @property
    def rollout(self) -> list[str]:
        return [d for w in self.workers for d in w.devices]

    @property
    def devices(self) -> list[str]:
        critic = self.critic.devices if self.critic is not None else []
        return list(dict.fromkeys(self.rollout + self.learner.devices + critic))

    @property
    def trainers(self) -> list[str]:
        """The devices that wait for experience: the learner's and the critic's."""
        return self.learner.devices + (self.critic.devices if self.critic else [])


def layout_for(cfg: ColocatedPlacementConfig | DisaggregatedPlacementConfig) -> Layout:
    layout = _roles_layout(cfg)
    if not cfg.critic_devices:
        return layout
    first = len(layout.devices)
    critic = Slot(len(layout.bundles), cfg.critic_devices,
                  [f"gpu:{first + j}" for j in range(cfg.critic_devices)])
    return replace(layout, critic=critic,
                   bundles=[*layout.bundles, {"GPU": float(cfg.critic_devices)}])


def _roles_layout(cfg: ColocatedPlacementConfig | DisaggregatedPlacementConfig) -> Layout:
    if isinstance(cfg, DisaggregatedPlacementConfig):
        per, n = cfg.devices_per_worker, cfg.rollout_workers
        workers = [Slot(i, per, [f"gpu:{i * per + j}" for j in range(per)]) for i in range(n)]
        learner = Slot(n, cfg.learner_devices,
                       [f"gpu:{n * per + j}" for j in range(cfg.learner_devices)])
        bundles = [{"GPU": float(per)}] * n + [{"GPU": float(cfg.learner_devices)}]
        return Layout(workers, learner, bundles, cfg.strategy, on_ray=True,
                      learner_ranks=cfg.learner_devices)
    if not cfg.ray:
        devices = [f"cpu:{i}" for i in range(cfg.devices)]
        return Layout([Slot(0, 0, devices)], Slot(0, 0, devices), [], cfg.strategy,
                      on_ray=False)
    workers = [Slot(i, 0.5, [f"gpu:{i}"]) for i in range(cfg.devices)]
    return Layout(workers, Slot(0, 0.5, ["gpu:0"]), [{"GPU": 1.0}] * cfg.devices,
                  cfg.strategy, on_ray=True)


def check_fits(layout: Layout, nodes: list[dict[str, float]]) -> None:
    """Refuse, naming what was asked and what is there, a layout no grant can satisfy.
    ``nodes`` are the alive nodes' total resources."""
    asked = sum(b.get("GPU", 0.0) for b in layout.bundles)
    have = sum(n.get("GPU", 0.0) for n in nodes)
    shape = " + ".join(f"{b['GPU']:g}" for b in layout.bundles)
    per_node = ", ".join(f"{n.get('GPU', 0.0):g}" for n in nodes) or "no nodes"
    what = (f"placement asks for {asked:g} GPUs in {len(layout.bundles)} bundles ({shape}, "
            f"{layout.strategy}); the cluster has {have:g} GPUs (per node: {per_node})")
    if asked > have:
        raise PlacementError(f"{what}. Lower the placement's devices or add GPUs.")
    biggest = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if any(b["GPU"] > biggest for b in layout.bundles):
        raise PlacementError(f"{what}: a bundle is larger than any node.")
    if layout.strategy == "STRICT_PACK" and asked > biggest:
        raise PlacementError(f"{what}: STRICT_PACK needs them all on one node; use PACK.")


def reserve(layout: Layout, timeout_s: float):
    """A ready Ray placement group for ``layout`` (Ray must be initialized)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_fits(layout, [n["Resources"] for n in ray.nodes() if n["Alive"]])
    pg = placement_group(layout.bundles, strategy=layout.strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"Ray did not grant the placement group {layout.bundles} "
                             f"({layout.strategy}) within {timeout_s:g} s "
                             f"(placement.ready_timeout_s); available now: "
                             f"{ray.available_resources()}")
    return pg
