import hashlib
import hmac
import secrets
from pathlib import Path

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.utils import timezone

from engine.config import (
    NATIVE,
    ExternalRunConfig,
    RunConfig,
    fork_name,
    is_external,
    validate_config,
    validate_external,
)
from jobs.models.status import (
    CONTROLLABLE,
    TERMINAL,
    InvalidTransition,
    RunStatus,
    path_between,
    sources_of,
)
from jobs.models.validators import normalized_config, validate_run_config

PRIORITY_BOUND = 1000  # priorities run from -1000 to 1000; higher starts first


def run_directory(run_id: int) -> Path:
    """The run's own directory under the runs dir: its checkpoints, the driver's files."""
    return Path(settings.RLPLANE_RUNS_DIR) / f"run-{run_id}"


class NotNative(Exception):
    """What needs an rlplane RunConfig (fork, planner, placement preview, the engine's
    knobs) was asked of an external run, which has none; ``str()`` says so, naming the
    framework, for the page or the API to show."""

    def __init__(self, run: "Run", need: str = "this"):
        self.run = run
        super().__init__(
            f"run #{run.pk} is a {run.framework} run: rlplane watches it but does not train "
            f"it, so it has no rlplane run config and {need} needs one; launch an rlplane "
            f"run to use it")


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Run(models.Model):
    name = models.CharField(max_length=200)
    config = models.JSONField(validators=[validate_run_config])
    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.QUEUED, db_index=True
    )
    status_reason = models.TextField(blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="forks"
    )
    source_checkpoint = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="runs",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    ray_submission_id = models.CharField(max_length=200, blank=True)
    # Set by a stop request; the driver polls it (GET /api/runs/<id>/controls answers
    # "stop"), checkpoints and exits. Only a driver that does not answer in time gets its
    # Ray job stopped.
    stop_requested_at = models.DateTimeField(null=True, blank=True)
    # sha256 hex of the ingest token; the raw token exists only in the driver's environment.
    ingest_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    # The queue (jobs/runs/queue.py) starts queued runs by priority (higher first), then FIFO.
    priority = models.IntegerField(default=0, validators=[
        MinValueValidator(-PRIORITY_BOUND), MaxValueValidator(PRIORITY_BOUND)])
    # Archived runs leave the runs list and the API's default listing; nothing else changes.
    archived_at = models.DateTimeField(null=True, blank=True)
    # ThroughputRegression's reference, marked by an operator (jobs.alerts.lifecycle
    # baseline_problem checks it): ahead of a fork's parent and the run's own first steps.
    baseline_run = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="baseline_for"
    )
    # The driver's restarts (run.max_restarts, jobs/runs/restart.py), oldest first:
    # {"at": ISO time, "cause": why the driver ended, "job": the Ray job that ended,
    # "step": the last step stored then}. The run page lists them and marks their steps.
    restarts = models.JSONField(default=list, blank=True, editable=False)
    # What the last alert evaluation checked: {rule kind: the step its inputs reached}
    # for each rule the history fed (jobs.alerts.coverage.checked); the run page's
    # health strip reads it. A kind absent was not evaluated (its inputs are missing).
    rules_checked = models.JSONField(default=dict, blank=True, editable=False)
    # The rollout workers after the driver's latest live resize (workers.resized, set by
    # ingest), which the queue counts as held; None: the launch config's (no resize yet,
    # or a driver that started again since: it places the launch config).
    rollout_workers = models.PositiveIntegerField(null=True, blank=True, editable=False)
    # Bumped by ingest when it stores a metrics, span or sync event at or below the run's
    # highest seq (out of order): a history the alert rules keep and extend past its highest
    # seq (jobs/alerts/recent.py) is read again.
    history_rewrites = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} (#{self.pk}, {self.status})"

    def save(self, *args, **kwargs):
        update_fields = kwargs.get("update_fields")
        if update_fields is None or "config" in update_fields:
            self.config = normalized_config(self.config)
        super().save(*args, **kwargs)

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL

    @property
    def accepts_controls(self) -> bool:
        """Whether a live control may be asked of the run now (the run page shows its
        controls, do_request_control accepts one). An external run takes none: its
        framework has no hook for rlplane's live controls (stop still reaches it)."""
        return self.status in CONTROLLABLE and not self.is_external

    @property
    def framework(self) -> str:
        """Who trains the run: "rlplane" (its own engine) or an external framework."""
        return self.config.get("framework", NATIVE) if isinstance(self.config, dict) else NATIVE

    def steps_done(self, last_step: int | None) -> int | None:
        """How many steps the run has trained, from the last step its metrics name: the
        engine numbers steps from 0 (step k's metrics close the (k+1)th step, and its
        checkpoint is step_{k+1}); an external framework reports its own count (TRL's
        global_step). The run page's "step N of M" and the runs list count this way."""
        if last_step is None or self.is_external:
            return last_step
        return last_step + 1

    @property
    def is_external(self) -> bool:
        """A run another framework trains (TRL, veRL, ...): rlplane watches it."""
        return is_external(self.config)

    @property
    def external_config(self) -> ExternalRunConfig:
        """An external run's stored config, validated (ValueError on a native run)."""
        if not self.is_external:
            raise ValueError(f"run #{self.pk} is a run of rlplane's own engine")
        return validate_external(self.config)

    @property
    def run_config(self) -> RunConfig:
        """The stored config as a RunConfig, validated once per instance (again only once
        ``config`` is replaced, as save and refresh_from_db do). Files are not checked: a
        run's model or data may have moved since it launched, and its config must stay
        readable; launching checks them (the run form, the REST API, the CLI).
        Raises NotNative on an external run, which has no RunConfig."""
        if self.is_external:
            raise NotNative(self, "this")
        cached = getattr(self, "_run_config", None)
        if cached is None or cached[0] is not self.config:
            self._run_config = (self.config, validate_config(self.config, check_files=False))
        return self._run_config[1]

    @property
    def max_restarts(self) -> int:
        """How many times sync_runs submits a driver that died without saying why again
        (run.max_restarts, jobs/runs/restart.py); 0 for an external run, whose command
        rlplane does not resume."""
        return 0 if self.is_external else self.run_config.max_restarts

    def fork_config(self, from_step: int | None = None) -> RunConfig:
        """What a fork of this run from its checkpoint at ``from_step`` launches unless
        given another config: this run's, named by fork_name; from a checkpoint at or past
        its ``steps`` (a finished run's last), as many steps again, so that the default
        trains something (fork_problem). NotNative for an external run (its framework
        forks it)."""
        if self.is_external:
            raise NotNative(self, "a fork")
        cfg = self.run_config
        update = {"name": fork_name(cfg.name)}
        if from_step is not None and from_step >= cfg.steps:
            update["steps"] = from_step + cfg.steps
        return cfg.model_copy(update=update)

    def transition_to(self, new: str, reason: str = "") -> None:
        """Move to ``new`` if the stored status allows it, else raise InvalidTransition.

        One conditional UPDATE, so two workers racing on the same run cannot both win
        and a stale in-memory status cannot overwrite a newer one.
        """
        new = RunStatus(new)
        now = timezone.now()
        changes: dict = {"status": new, "status_reason": reason}
        if new == RunStatus.RUNNING:
            changes["started_at"] = now
        if new in TERMINAL:
            changes["finished_at"] = now
        updated = Run.objects.filter(pk=self.pk, status__in=sources_of(new)).update(**changes)
        if updated != 1:
            current = Run.objects.filter(pk=self.pk).values_list("status", flat=True).first()
            if current is not None:
                self.status = current
            raise InvalidTransition(self.pk, current, new)
        for field, value in changes.items():
            setattr(self, field, value)

    def advance_to(self, target: str, reason: str = "") -> None:
        """Move to ``target`` along the shortest legal walk from the stored status, each
        step a ``transition_to`` with ``reason``: a submitting run passes through running,
        a running one through stopping on its way to stopped. Already there: nothing to
        do. Raises InvalidTransition when no walk leads there (a terminal run, stopping
        back to running) or another writer moved the run in between."""
        target = RunStatus(target)
        self.refresh_from_db(fields=["status"])
        if self.status == target:
            return
        path = path_between(self.status, target)
        if not path:
            raise InvalidTransition(self.pk, self.status, target)
        for status in path:
            self.transition_to(status, reason)

    def request_stop(self, reason: str) -> None:
        """Ask the driver to checkpoint and exit: running -> stopping, and the flag it polls.
        A run still being submitted keeps its status (the engine reports "running" first)
        and sees the flag at its first poll. Raises InvalidTransition for any other state."""
        if self.status == RunStatus.RUNNING:
            self.transition_to(RunStatus.STOPPING, reason)
        elif self.status not in (RunStatus.SUBMITTING, RunStatus.STOPPING):
            raise InvalidTransition(self.pk, self.status, RunStatus.STOPPING)
        if self.stop_requested_at is None:
            self.stop_requested_at = timezone.now()
            Run.objects.filter(pk=self.pk, stop_requested_at=None).update(
                stop_requested_at=self.stop_requested_at)

    def issue_ingest_token(self) -> str:
        """A fresh ingest token: returned once, only its hash is kept (and saved if the run
        is already in the database). Issuing again revokes the previous token."""
        token = secrets.token_urlsafe(32)
        self.ingest_token_hash = hash_token(token)
        if self.pk is not None:
            Run.objects.filter(pk=self.pk).update(ingest_token_hash=self.ingest_token_hash)
        return token

    def claim_ingest_token(self) -> str | None:
        """A fresh token, stored only if the stored hash is still the one this instance
        read: of two submitters that read the same state exactly one gets a token (the
        other gets None). ``release_ingest_token`` undoes a claim that lost anyway."""
        token = secrets.token_urlsafe(32)
        claimed = Run.objects.filter(pk=self.pk, ingest_token_hash=self.ingest_token_hash) \
            .update(ingest_token_hash=hash_token(token))
        if not claimed:
            return None
        self._claimed_over = self.ingest_token_hash
        self.ingest_token_hash = hash_token(token)
        return token

    def release_ingest_token(self) -> None:
        """Put back the hash this instance's claim replaced, unless another claim came
        since: a twin that minted after the winner did, but reached Ray second, must not
        leave the winner's driver locked out of ingest."""
        Run.objects.filter(pk=self.pk, ingest_token_hash=self.ingest_token_hash) \
            .update(ingest_token_hash=self._claimed_over)
        self.ingest_token_hash = self._claimed_over

    def has_ingest_token(self, token: str) -> bool:
        if not self.ingest_token_hash:
            return False
        return hmac.compare_digest(hash_token(token), self.ingest_token_hash)

    def fork_problem(self, config: dict, from_step: int | None = None) -> tuple[str, str] | None:
        """Why a fork of this run with ``config`` from its checkpoint at ``from_step``
        cannot start, as (field path, message with the fix); None when it can. The form,
        the REST API and so the CLI all ask here (do_fork_run).

        A fork's ``steps`` is where it trains to, counted from the start of this run (the
        engine resumes at the checkpoint's step): at or below ``from_step`` it would end
        "succeeded" having trained nothing. PPO continues the checkpoint's critic: a run
        trained without one (GRPO) has none to give."""
        if self.is_external:
            return ("(run)", str(NotNative(self, "a fork")))
        child = validate_config(config, check_files=False)
        if from_step is not None and child.steps <= from_step:
            return ("steps",
                    f"steps = {child.steps} is the step the fork trains to, counted from the "
                    f"start of run #{self.pk}, and its checkpoint is at step {from_step}: the "
                    f"fork would train nothing. Set steps above {from_step} "
                    f"(steps = {from_step + child.steps} trains {child.steps} more)")
        parent = self.run_config.algorithm
        if (child.algorithm.type != "ppo" or parent.type == "ppo"
                or child.algorithm.critic.path is not None):
            return None
        return ("algorithm.critic.path",
                f'run #{self.pk} trained with algorithm.type = "{parent.type}", without a '
                f'critic, so its checkpoints hold none for PPO to continue; set '
                f'algorithm.critic.path to a directory to start the critic from (a PPO '
                f'checkpoint\'s critic/, or the model the run started from), or fork with '
                f'algorithm.type = "{parent.type}"')
