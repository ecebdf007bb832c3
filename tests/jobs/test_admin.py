import pytest

from .helpers import checkpoint, log, metrics, post_events, span


@pytest.mark.parametrize("model", ["preset", "run", "runevent", "metricpoint", "phasespan",
                                   "checkpoint"])
def test_every_model_is_listed_and_editable_in_the_admin(admin_client, client, run, token,
                                                         model):
    post_events(client, run, token, [metrics(1, 0, loss=1.0), span(2, 0), checkpoint(3, 0),
                                     log(4)])

    listing = admin_client.get(f"/admin/jobs/{model}/")
    added = admin_client.get(f"/admin/jobs/{model}/add/")

    assert (listing.status_code, added.status_code) == (200, 200)


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
