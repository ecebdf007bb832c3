"""Ids in query strings: Unicode digits and 64-bit overflows are ignored, never a 500
(issue 19 item 9: "?run=²" gave a 500, since "²".isdigit() is True)."""

import pytest

from jobs.models.validators import parse_pk

from .helpers import checkpoint_on_disk


@pytest.mark.parametrize("text, pk", [("12", 12), ("²", None), ("١٢", None), ("", None),
                                      ("-3", None), ("9" * 19, None), ("9" * 18, 10**18 - 1)])
def test_parse_pk_takes_ascii_digits_that_fit_a_column(text, pk):
    assert parse_pk(text) == pk


@pytest.mark.parametrize("query", ["run=²", "run=" + "9" * 30, "run=١"])
def test_the_alerts_page_ignores_an_id_that_is_no_id(operator, query):
    assert operator.get(f"/alerts?{query}").status_code == 200


@pytest.mark.parametrize("query", ["preset=²", "preset=" + "9" * 30])
def test_the_new_run_page_ignores_a_preset_id_that_is_no_id(operator, query):
    assert operator.get(f"/runs/new?{query}").status_code == 200


def test_the_fork_page_ignores_a_checkpoint_id_that_is_no_id(operator, run):
    checkpoint_on_disk(run, 2)
    assert operator.get(f"/runs/{run.pk}/fork?checkpoint=²").status_code == 200
