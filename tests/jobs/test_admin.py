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
