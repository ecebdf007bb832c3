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

A rollout worker added live (engine.orchestration.resizing) takes a placement group of its
own, one bundle like the last launch worker's, numbered after every device so far:

    disaggregated, rollout_workers=1, then set_rollout_workers 3:
        run's group   bundle 0 gpu:0 worker 0   bundle 1 gpu:1 learner
        own groups    gpu:2 worker 1            gpu:3 worker 2
    then set_rollout_workers 1: workers 2 and 1 leave, their groups removed (freed). A
    launch worker that leaves keeps its bundle (a placement group gives none back): idle,
    the first place a later resize fills.

Device names number the placement's devices (gpu:<k>), not the node's. Spans are recorded
per logical device, so bubble and utilization mean the same on a CPU slot, a logical GPU
(``ray.init(num_gpus=N)`` on a CPU box) or a real GPU. A placement that cannot fit the
cluster is refused before anything launches (PlacementError: asked vs available).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

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
        # overlapped: the rollout worker's thread and its cores are a device of their own
        worker = [f"cpu:{cfg.devices}"] if cfg.overlap_threads else devices
        return Layout([Slot(0, 0, worker)], Slot(0, 0, devices), [], cfg.strategy,
                      on_ray=False)
    workers = [Slot(i, 0.5, [f"gpu:{i}"]) for i in range(cfg.devices)]
    return Layout(workers, Slot(0, 0.5, ["gpu:0"]), [{"GPU": 1.0}] * cfg.devices,
                  cfg.strategy, on_ray=True)


def worker_template(layout: Layout) -> tuple[dict[str, float], Slot]:
    """The bundle and slot one more rollout worker takes: the last launch worker's."""
    last = layout.workers[-1]
    return layout.bundles[last.bundle], last


def grown_bundles(layout: Layout, workers: int) -> list[dict[str, float]]:
    """The bundles a run holds with ``workers`` rollout workers: its launch placement's,
    and one of its own per worker beyond the launch's (fewer keep the launch's bundles)."""
    if not layout.on_ray:
        return list(layout.bundles)
    bundle, _ = worker_template(layout)
    return [*layout.bundles, *[bundle] * max(0, workers - len(layout.workers))]


@dataclass(frozen=True)
class Place:
    """Where one rollout worker runs: its slot, in ``pg`` (the run's placement group, or
    one of its own, ``own``, removed when its worker leaves)."""
    slot: Slot
    pg: Any
    own: bool = False


class RolloutPlaces:
    """The rollout workers' places on Ray, in worker order: the launch's, then those
    added live (``take``), each given back when its worker leaves (``give_back``, the
    last first). ``close`` removes the placement groups it made."""

    def __init__(self, layout: Layout, pg, timeout_s: float):
        self.layout, self.timeout_s = layout, timeout_s
        self.used = [Place(slot, pg) for slot in layout.workers]
        self.idle: list[Place] = []        # launch places whose worker left
        self.next_device = len(layout.devices)
        self._made: list[Any] = []         # the placement groups of places now used

    @property
    def devices(self) -> list[str]:
        """The devices the run holds: the launch layout's and the added places'."""
        added = [d for p in self.used if p.own for d in p.slot.devices]
        return self.layout.devices + added

    def _held_gpus(self) -> float:
        """The GPUs the run's bundles hold with its workers now (idle launch ones too)."""
        return sum(b.get("GPU", 0.0) for b in grown_bundles(self.layout, len(self.used)))

    def check_room(self, more: int) -> None:
        """PlacementError, at once, when the cluster could never hold ``more`` workers on
        top of what the run holds (the idle launch bundles are taken first)."""
        import ray

        bundle, like = worker_template(self.layout)
        new = max(0, more - len(self.idle))
        if new:
            # each its own group of one bundle: no strategy binds them together
            check_fits(Layout([like] * new, like, [bundle] * new, "PACK", on_ray=True),
                       [n["Resources"] for n in ray.nodes() if n["Alive"]],
                       self._held_gpus(), what=f"{new} more rollout worker(s)")

    def take(self) -> Place:
        """A place for one more worker: an idle launch bundle, else a placement group of
        its own (PlacementError when the cluster cannot hold it, at once, or when Ray has
        not granted it within ``timeout_s``)."""
        if self.idle:
            place = self.idle.pop()
        else:
            bundle, like = worker_template(self.layout)
            pg = reserve(Layout([like], like, [bundle], self.layout.strategy, on_ray=True),
                         self.timeout_s, self._held_gpus(), what="one more rollout worker")
            n = len(like.devices)
            devices = [f"gpu:{self.next_device + j}" for j in range(n)]
            self.next_device += n
            place = Place(Slot(0, like.gpus, devices), pg, own=True)
            self._made.append(pg)
        self.used.append(place)
        return place

    def give_back(self) -> Place:
        """The last place's worker left: its own group removed, a launch bundle kept idle."""
        place = self.used.pop()
        if place.own:
            from ray.util.placement_group import remove_placement_group

            self._made.remove(place.pg)
            remove_placement_group(place.pg)
        else:
            self.idle.append(place)
        return place

    def close(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for pg in self._made:
            remove_placement_group(pg)
        self._made = []


def check_fits(layout: Layout, nodes: list[dict[str, float]], held: float = 0.0,
               what: str = "placement") -> None:
    """Refuse, naming what was asked and what is there, a layout no grant can satisfy.
    ``nodes`` are the alive nodes' total resources; ``held``: GPUs the run holds already
    (a live resize's new bundle comes on top of them)."""
    asked = sum(b.get("GPU", 0.0) for b in layout.bundles)
    have = sum(n.get("GPU", 0.0) for n in nodes) - held
    shape = " + ".join(f"{b['GPU']:g}" for b in layout.bundles)
    per_node = ", ".join(f"{n.get('GPU', 0.0):g}" for n in nodes) or "no nodes"
    besides = f" besides the {held:g} this run holds" if held else ""
    what = (f"{what} asks for {asked:g} GPUs in {len(layout.bundles)} bundles ({shape}, "
            f"{layout.strategy}); the cluster has {have:g} GPUs{besides} (per node: {per_node})")
    if asked > have:
        raise PlacementError(f"{what}. Lower the placement's devices or add GPUs.")
    biggest = max((n.get("GPU", 0.0) for n in nodes), default=0.0)
    if any(b["GPU"] > biggest for b in layout.bundles):
        raise PlacementError(f"{what}: a bundle is larger than any node.")
    if layout.strategy == "STRICT_PACK" and asked > biggest:
        raise PlacementError(f"{what}: STRICT_PACK needs them all on one node; use PACK.")


def reserve(layout: Layout, timeout_s: float, held: float = 0.0, what: str = "placement"):
    """A ready Ray placement group for ``layout`` (Ray must be initialized)."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_fits(layout, [n["Resources"] for n in ray.nodes() if n["Alive"]], held, what)
    pg = placement_group(layout.bundles, strategy=layout.strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        remove_placement_group(pg)
        raise PlacementError(f"Ray did not grant the placement group {layout.bundles} "
                             f"({layout.strategy}) within {timeout_s:g} s "
                             f"(placement.ready_timeout_s); available now: "
                             f"{ray.available_resources()}")
    return pg
