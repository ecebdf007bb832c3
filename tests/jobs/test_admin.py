import pytest

from jobs.models import MetricPoint, PhaseSpan, RunEvent

from .helpers import checkpoint, log, metrics, post_events, span


@pytest.mark.parametrize("model", ["preset", "run", "checkpoint"])
def test_every_model_is_listed_and_editable_in_the_admin(admin_client, client, run, token,
                                                         model):
    post_events(client, run, token, [metrics(1, 0, loss=1.0), span(2, 0), checkpoint(3, 0),
                                     log(4)])

    listing = admin_client.get(f"/admin/jobs/{model}/")
    added = admin_client.get(f"/admin/jobs/{model}/add/")

    assert (listing.status_code, added.status_code) == (200, 200)


@pytest.mark.parametrize("model", [RunEvent, MetricPoint, PhaseSpan])
def test_a_runs_record_and_what_is_derived_from_it_are_shown_never_written(
        admin_client, client, run, token, model):
    """An edit of one event, point or span in the admin left its derived rows (tiers, the
    alert rules' cached history) telling another story."""
    post_events(client, run, token, [metrics(1, 0, loss=1.0), span(2, 0), log(3)])
    row = model.objects.filter(run=run).first()
    page = f"/admin/jobs/{model._meta.model_name}/"
    before = list(model.objects.values())

    assert admin_client.get(page).status_code == 200
    assert admin_client.get(f"{page}{row.pk}/change/").status_code == 200   # shown
    assert admin_client.get(f"{page}add/").status_code == 403
    assert admin_client.post(f"{page}{row.pk}/change/", {"run": run.pk}).status_code == 403
    assert admin_client.post(f"{page}{row.pk}/delete/", {"post": "yes"}).status_code == 403
    admin_client.post(page, {"action": "delete_selected", "_selected_action": [row.pk],
                             "post": "yes"})
    assert list(model.objects.values()) == before


def test_an_admin_revokes_anyones_api_token_but_never_sees_or_makes_one(admin_client):
    from jobs.models import ApiToken

    from .helpers import api_token

    raw = api_token("vic", operator=False)
    row = ApiToken.objects.get()

    assert admin_client.get("/admin/jobs/apitoken/add/").status_code == 403
    page = admin_client.get(f"/admin/jobs/apitoken/{row.pk}/change/").content.decode()
    assert raw not in page and row.token_hash not in page
    admin_client.post("/admin/jobs/apitoken/", {"action": "revoke",
                                                "_selected_action": [row.pk]})
    assert ApiToken.user_for(raw) is None
