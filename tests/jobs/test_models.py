import hashlib

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from jobs.models import Preset, Run
from jobs.models import run as run_module


def test_a_run_keeps_only_the_sha256_of_its_ingest_token(make_run):
    run = make_run()

    token = run.issue_ingest_token()

    stored = Run.objects.values_list("ingest_token_hash", flat=True).get(pk=run.pk)
    assert stored == hashlib.sha256(token.encode()).hexdigest()
    assert token not in stored
    assert Run.objects.get(pk=run.pk).has_ingest_token(token)


def test_a_wrong_token_and_a_run_without_a_token_are_refused(make_run):
    run = make_run()
    assert not run.has_ingest_token("anything")

    token = run.issue_ingest_token()

    assert not run.has_ingest_token(token + "x")
    assert not run.has_ingest_token("")


def test_issuing_a_new_token_revokes_the_old_one(make_run):
    run = make_run()
    old = run.issue_ingest_token()

    new = run.issue_ingest_token()

    run = Run.objects.get(pk=run.pk)
    assert run.has_ingest_token(new) and not run.has_ingest_token(old)


def test_a_token_issued_before_the_run_is_saved_is_saved_with_it(db):
    run = Run(name="r", config={})
    token = run.issue_ingest_token()
    run.save()

    assert Run.objects.get(pk=run.pk).has_ingest_token(token)


def test_a_run_stores_its_config_with_every_default_filled_in(db):
    run = Run.objects.create(name="r", config={"steps": 7})

    config = Run.objects.get(pk=run.pk).config
    assert config["steps"] == 7
    assert {"rollout", "placement", "async_policy", "algorithm"} <= set(config)


def test_a_run_with_an_invalid_config_is_not_saved_and_the_error_names_the_field(db):
    with pytest.raises(ValidationError, match=r"rollout.temperature: Input should be less"):
        Run.objects.create(name="r", config={"rollout": {"temperature": 9}})

    assert not Run.objects.exists()


def test_full_clean_reports_a_bad_config_on_the_config_field(db):
    run = Run(name="r", config={"no_such_section": {}})

    with pytest.raises(ValidationError) as excinfo:
        run.full_clean()

    assert "no_such_section" in " ".join(excinfo.value.message_dict["config"])


def test_a_config_that_is_not_an_object_is_refused(db):
    with pytest.raises(ValidationError, match="must be a JSON object"):
        Run.objects.create(name="r", config=["steps", 3])


def test_a_preset_is_a_named_validated_config(db):
    Preset.objects.create(name="demo", config={"steps": 5}, description="small")

    with pytest.raises(ValidationError, match="steps"):
        Preset.objects.create(name="bad", config={"steps": -1})
    with pytest.raises(IntegrityError):
        Preset.objects.create(name="demo", config={})


def test_a_fork_points_at_its_parent_and_the_checkpoint_it_starts_from(make_run):
    parent = make_run()

    fork = Run.objects.create(name="fork", config={}, parent=parent,
                              source_checkpoint="/runs/1/checkpoints/step_000010")

    assert list(parent.forks.all()) == [fork]


def test_a_runs_config_is_validated_once_and_again_only_when_replaced(db, monkeypatch):
    run = Run.objects.create(name="r", config={"steps": 7})
    calls = []
    real = run_module.validate_config
    monkeypatch.setattr(run_module, "validate_config",
                        lambda data, **kw: calls.append(data) or real(data, **kw))

    assert run.run_config.steps == 7 and run.run_config is run.run_config
    assert len(calls) == 1
    Run.objects.filter(pk=run.pk).update(config={**run.config, "steps": 9})
    run.refresh_from_db()
    assert run.run_config.steps == 9 and len(calls) == 2


def test_a_fork_is_named_after_its_parent_within_the_name_bound(db):
    run = Run.objects.create(name="r", config={"name": "x" * 100})

    assert run.fork_config().name == "x" * 100
    assert Run.objects.create(name="p", config={"name": "p"}).fork_config().name == "p-fork"
