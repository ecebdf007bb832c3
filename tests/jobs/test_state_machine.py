import pytest

from jobs.models import LIVE, TERMINAL, TRANSITIONS, InvalidTransition, Run, RunStatus
from jobs.models.status import path_between

S = RunStatus
# The run's life as the operator is promised it, written out here rather than read from
# TRANSITIONS, so that a wrong edit of the code's table fails a test. A row per state,
# a column per target; "x" = allowed.
TABLE = """
            queued submitting running stopping succeeded failed stopped lost
queued        .        x        .       .        .        x      x      x
submitting    .        .        x       .        .        x      .      x
running       .        .        .       x        x        x      .      x
stopping      .        .        .       .        x        x      x      x
succeeded     .        .        .       .        .        .      .      .
failed        .        .        .       .        .        .      .      .
stopped       .        .        .       .        .        .      .      .
lost          .        .        .       .        .        .      .      .
"""


def table_cells() -> list[tuple[str, str, bool]]:
    header, *rows = (line.split() for line in TABLE.strip().splitlines())
    return [(row[0], new, mark == "x") for row in rows for new, mark in zip(header, row[1:],
                                                                              strict=True)]


LEGAL = sorted((old, new) for old, new, allowed in table_cells() if allowed)
ILLEGAL = sorted((old, new) for old, new, allowed in table_cells() if not allowed and old != new)


def test_the_table_names_every_state_once_in_each_direction():
    header, *rows = (line.split() for line in TABLE.strip().splitlines())
    assert sorted(header) == sorted(row[0] for row in rows) == sorted(S)


def stored_status(run: Run) -> str:
    return Run.objects.values_list("status", flat=True).get(pk=run.pk)


def test_a_run_walks_from_queued_to_succeeded_and_records_when_it_started_and_finished(make_run):
    run = make_run(S.QUEUED)

    run.transition_to(S.SUBMITTING)
    run.transition_to(S.RUNNING)
    assert run.started_at is not None and run.finished_at is None
    run.transition_to(S.STOPPING, "operator asked")
    run.transition_to(S.SUCCEEDED, "finished its last step")

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.SUCCEEDED, "finished its last step")
    assert run.finished_at >= run.started_at


@pytest.mark.parametrize(("old", "new"), LEGAL)
def test_every_legal_transition_is_applied(make_run, old, new):
    run = make_run(old)

    run.transition_to(new, reason="because")

    assert stored_status(run) == new
    assert run.status == new and run.status_reason == "because"


@pytest.mark.parametrize(("old", "new"), ILLEGAL)
def test_every_illegal_transition_is_refused_and_changes_nothing(make_run, old, new):
    run = make_run(old, status_reason="kept")

    with pytest.raises(InvalidTransition, match=f"run {run.pk}"):
        run.transition_to(new)

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (old, "kept")


@pytest.mark.parametrize("terminal", sorted(TERMINAL))
def test_a_terminal_state_is_final_and_the_error_says_so(make_run, terminal):
    run = make_run(terminal)

    with pytest.raises(InvalidTransition, match=f"is {terminal}, which is final"):
        run.transition_to(S.RUNNING)


def test_the_error_for_a_wrong_step_names_the_steps_that_are_allowed(make_run):
    run = make_run(S.QUEUED)

    with pytest.raises(InvalidTransition, match=r"from queued to running \(allowed: "
                                                r"failed, lost, stopped, submitting\)"):
        run.transition_to(S.RUNNING)


def test_a_stale_copy_of_a_run_cannot_overwrite_a_newer_status(make_run):
    run = make_run(S.SUBMITTING)
    stale = Run.objects.get(pk=run.pk)
    run.transition_to(S.LOST, "ray job vanished")

    with pytest.raises(InvalidTransition):
        stale.transition_to(S.RUNNING)

    assert stored_status(run) == S.LOST
    assert stale.status == S.LOST  # the refusal tells the stale copy where the run is


def test_a_transition_of_a_deleted_run_says_it_does_not_exist(make_run):
    run = make_run(S.QUEUED)
    Run.objects.filter(pk=run.pk).delete()

    with pytest.raises(InvalidTransition, match="does not exist"):
        run.transition_to(S.SUBMITTING)


def test_an_unknown_status_is_a_value_error(make_run):
    with pytest.raises(ValueError):
        make_run(S.QUEUED).transition_to("paused")


def test_every_state_is_reachable_from_queued_and_nothing_leaves_a_terminal_state():
    reachable, frontier = {S.QUEUED}, [S.QUEUED]
    while frontier:
        for new in TRANSITIONS.get(frontier.pop(), ()):
            if new not in reachable:
                reachable.add(new)
                frontier.append(new)

    assert reachable == set(S)
    assert not TERMINAL & set(TRANSITIONS)


@pytest.mark.parametrize(("old", "new", "path"), [
    (S.SUBMITTING, S.STOPPED, [S.RUNNING, S.STOPPING, S.STOPPED]),
    (S.SUBMITTING, S.SUCCEEDED, [S.RUNNING, S.SUCCEEDED]),
    (S.RUNNING, S.STOPPED, [S.STOPPING, S.STOPPED]),
    (S.STOPPING, S.LOST, [S.LOST]),
    (S.STOPPING, S.RUNNING, []),
    (S.FAILED, S.RUNNING, []),
    (S.RUNNING, S.RUNNING, []),
])
def test_the_path_between_two_states_is_the_shortest_legal_walk(old, new, path):
    assert path_between(old, new) == path


def test_advance_to_walks_every_step_of_the_path_and_records_the_reason(make_run):
    run = make_run(S.SUBMITTING)

    run.advance_to(S.STOPPED, "the Ray job was stopped")

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.STOPPED, "the Ray job was stopped")
    assert run.started_at is not None and run.finished_at is not None


def test_advance_to_the_current_status_changes_nothing(make_run):
    run = make_run(S.RUNNING, status_reason="kept")

    run.advance_to(S.RUNNING, "again")

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (S.RUNNING, "kept")


def test_advance_to_reads_the_stored_status_not_a_stale_copy(make_run):
    run = make_run(S.RUNNING)
    stale = Run.objects.get(pk=run.pk)
    run.transition_to(S.STOPPING, "operator asked")

    stale.advance_to(S.STOPPED, "checkpointed")

    assert stored_status(run) == S.STOPPED


@pytest.mark.parametrize(("old", "new", "message"), [
    (S.LOST, S.RUNNING, "is lost, which is final"),
    (S.STOPPING, S.RUNNING, "cannot go from stopping to running"),
])
def test_advance_to_a_state_no_walk_reaches_is_refused_and_changes_nothing(
        make_run, old, new, message):
    run = make_run(old, status_reason="kept")

    with pytest.raises(InvalidTransition, match=message):
        run.advance_to(new)

    run.refresh_from_db()
    assert (run.status, run.status_reason) == (old, "kept")


def test_a_live_run_is_one_that_was_submitted_and_is_not_final():
    assert LIVE == set(S) - TERMINAL - {S.QUEUED}
