"""The rollout inspector: samples events through ingest to the page and its JSON."""

import pytest

from engine.api import SAMPLE_TOKEN_LIMIT, SAMPLES_PER_EVENT, RolloutSample, SamplesEvent
from jobs.models import InspectedSample, RunEvent

from .helpers import post_events

SCRIPT = "<script>alert('x')</script>"


def rollout(group=0, reward=0.0, truncated=False, version=3, last_version=3, gaps=(0.0,),
            completion="42", reason="correct"):
    n = len(gaps)
    behaviour = [-0.5] * n
    return RolloutSample(group=group, prompt=f"{group}+{group}=", completion=completion,
                         reward=reward, reason=reason, advantage=reward - 0.5, version=version,
                         last_version=last_version, staleness=1, length=n, truncated=truncated,
                         tokens=[f"t{i}" for i in range(n)], behaviour_logprobs=behaviour,
                         learner_logprobs=[b - g for b, g in zip(behaviour, gaps, strict=True)])


def turn(role, start, end, version=None, reward=None):
    return {"role": role, "start": start, "end": end, "version": version, "reward": reward}


def samples(seq, step, *rollouts):
    return SamplesEvent(seq=seq, ts=1000.0 + seq, step=step, samples=list(rollouts))


def a_step(seq=1, step=0):
    """Two groups of two: group 0 right and wrong, group 1 truncated with a large gap and
    one rollout continued under a newer version."""
    return samples(seq, step,
                   rollout(0, reward=1.0), rollout(0, reward=0.0, completion=SCRIPT),
                   rollout(1, reward=-0.1, truncated=True, gaps=(0.1, 2.5), reason="unfinished"),
                   rollout(1, reward=0.0, version=2, last_version=3))


def api(client, run, **params):
    return client.get(f"/api/v1/runs/{run.pk}/samples", params)


def shown(body) -> list[tuple[int, list[bool]]]:
    return [(g["group"], [s["match"] for s in g["samples"]]) for g in body["groups"]]


# --- ingest ---------------------------------------------------------------------------------

def test_a_samples_event_becomes_one_row_per_rollout_and_a_slim_event(client, run, token):
    response = post_events(client, run, token, [a_step()])

    assert response.status_code == 200, response.json()
    rows = list(InspectedSample.objects.filter(run=run).order_by("index"))
    assert [(r.group, r.reward, r.truncated) for r in rows] == [
        (0, 1.0, False), (0, 0.0, False), (1, -0.1, True), (1, 0.0, False)]
    assert rows[2].tokens == {"text": ["t0", "t1"], "behaviour": [-0.5, -0.5],
                              "learner": [-0.6, -3.0]}
    assert rows[2].max_gap == pytest.approx(2.5) and rows[3].mixes_versions
    # the event log keeps the step and count; the model text lives in the bounded rows
    payload = RunEvent.objects.get(run=run).payload
    assert payload == {"type": "samples", "seq": 1, "ts": 1001.0, "step": 0, "count": 4}


def test_a_replayed_samples_event_is_stored_once(client, run, token):
    post_events(client, run, token, [a_step()])

    response = post_events(client, run, token, [a_step()])

    assert response.json()["duplicates"] == 1
    assert InspectedSample.objects.filter(run=run).count() == 4


def test_a_step_sampled_again_takes_the_later_rollouts(client, run, token):
    post_events(client, run, token, [a_step(seq=1, step=5)])

    post_events(client, run, token, [samples(2, 5, rollout(0, reward=0.25))])

    assert list(InspectedSample.objects.filter(run=run).values_list("reward", flat=True)) \
        == [0.25]


def test_a_run_keeps_the_samples_of_its_last_steps_only(client, run, make_run, token,
                                                       settings):
    settings.RLPLANE_SAMPLE_STEPS = 3
    other = make_run(name="other")
    post_events(client, other, other.issue_ingest_token(), [a_step(seq=1, step=0)])

    post_events(client, run, token, [a_step(seq=i + 1, step=i) for i in range(5)])
    post_events(client, run, token, [a_step(seq=6, step=7)])

    steps = set(InspectedSample.objects.filter(run=run).values_list("step", flat=True))
    assert steps == {3, 4, 7}
    assert InspectedSample.objects.filter(run=other).count() == 4   # another run's stay


@pytest.mark.parametrize("change, field", [
    ({"reward": float("nan")}, "reward"),
    ({"reward": "1"}, "samples[0].reward"),
    ({"completion": "x" * 5000}, "completion"),
    ({"prompt": "a\x00b"}, "prompt"),
    ({"tokens": ["t0", "t1"]}, "tokens, behaviour_logprobs and learner_logprobs"),
    ({"tokens": ["x" * 100]}, "tokens"),
    ({"version": 2**60}, "version"),
    ({"surprise": 1}, "samples[0].surprise"),
    ({"turns": [turn("tool", 0, 1)]}, "[0].turns[0].role: 'tool'"),
    ({"turns": [turn("model", 0, 10**9)]}, "within the 1 tokens"),        # a browser loop
    ({"turns": [turn("model", 0, 1), turn("env", 0, 1)]}, "[0].turns[1]"),
    ({"turns": [{"role": "model", "start": 0}]}, "turns[0].end"),
])
def test_a_bad_rollout_value_is_refused_by_name_and_the_rest_is_stored(client, run, token,
                                                                       change, field):
    bad = a_step(seq=2).to_dict()
    bad["samples"][0].update(change)

    response = post_events(client, run, token, [a_step(seq=1), bad])

    assert response.status_code == 400
    (error,) = response.json()["errors"]
    assert error["seq"] == 2 and field in error["error"]
    assert InspectedSample.objects.filter(run=run).count() == 4


def test_too_many_rollouts_or_tokens_in_one_event_are_refused(client, run, token):
    many = samples(1, 0, *[rollout()] * (SAMPLES_PER_EVENT + 1)).to_dict()
    long = a_step(seq=2).to_dict()
    n = SAMPLE_TOKEN_LIMIT + 1
    long["samples"][0].update(tokens=["a"] * n, behaviour_logprobs=[-1.0] * n,
                              learner_logprobs=[-1.0] * n)
    many["samples"] = many["samples"] + [many["samples"][0]]

    response = post_events(client, run, token, [many, long])

    assert response.status_code == 400
    errors = [e["error"] for e in response.json()["errors"]]
    assert f"send at most {SAMPLES_PER_EVENT}" in errors[0]
    assert f"the limit is {SAMPLE_TOKEN_LIMIT}" in errors[1]
    assert not InspectedSample.objects.exists()


def test_a_trajectory_keeps_its_turns_and_an_older_clients_rollout_needs_none(client, run,
                                                                              token):
    n = 5
    traj = RolloutSample(
        group=0, prompt="2*3", completion="2*3=6:6", reward=1.0, version=3, last_version=4,
        length=n, tokens=["2*3=", "6", ":", "6", "<eos>"],
        behaviour_logprobs=[-0.5, None, None, -0.5, -0.5],
        learner_logprobs=[-1.0, None, None, -0.5, -0.25],
        turns=[turn("model", 0, 1, 3, 0.0), turn("env", 1, 3), turn("model", 3, 5, 4, 1.0)])
    older = samples(2, 1, rollout()).to_dict()
    del older["samples"][0]["turns"]

    response = post_events(client, run, token, [samples(1, 0, traj), older])

    assert response.status_code == 200, response.json()
    first, second = InspectedSample.objects.filter(run=run).order_by("step")
    assert first.tokens["turns"] == [turn("model", 0, 1, 3, 0.0), turn("env", 1, 3),
                                     turn("model", 3, 5, 4, 1.0)]
    assert first.max_gap == pytest.approx(0.5)       # model turns only: observations have none
    assert "turns" not in second.tokens


# --- the JSON and the page -------------------------------------------------------------------

def test_the_json_shows_the_latest_step_by_group(operator, run, token):
    post_events(operator, run, token, [a_step(seq=1, step=0), a_step(seq=2, step=4)])

    body = api(operator, run).json()

    assert body["step"] == 4 and body["steps"] == [0, 4]
    assert shown(body) == [(0, [True, True]), (1, [True, True])]
    assert body["groups"][0]["prompt"] == "0+0="
    assert body["groups"][1]["samples"][0]["tokens"]["text"] == ["t0", "t1"]


@pytest.mark.parametrize("params, expected", [
    ({"reward_min": "0.5"}, [(0, [True, False])]),
    ({"reward_min": "-1", "reward_max": "0"}, [(0, [False, True]), (1, [True, True])]),
    ({"truncated": "true"}, [(1, [True, False])]),
    ({"truncated": "false"}, [(0, [True, True]), (1, [False, True])]),
    ({"mixed": "true"}, [(1, [False, True])]),
    ({"gap_min": "1"}, [(1, [True, False])]),
    ({"order": "gap"}, [(1, [True, True]), (0, [True, True])]),
    ({"reward_min": "5"}, []),
])
def test_the_filters_pick_rollouts_and_show_their_groups_whole(operator, run, token, params,
                                                               expected):
    post_events(operator, run, token, [a_step()])

    assert shown(api(operator, run, step=0, **params).json()) == expected


@pytest.mark.parametrize("params, field", [
    ({"step": "x"}, "step"), ({"reward_min": "high"}, "reward_min"),
    ({"reward_max": "inf"}, "reward_max"), ({"truncated": "maybe"}, "truncated"),
    ({"order": "random"}, "order"), ({"reward_min": "2", "reward_max": "1"}, "reward_min"),
])
def test_a_bad_filter_is_400_naming_it(operator, run, params, field):
    response = api(operator, run, **params)

    assert response.status_code == 400
    assert [e["field"] for e in response.json()["errors"]] == [field]


def test_the_json_needs_a_login(client, run):
    assert api(client, run).status_code in (401, 403)


def test_the_page_escapes_model_text(operator, run, token):
    post_events(operator, run, token, [a_step()])

    page = operator.get(f"/runs/{run.pk}/samples")

    html = page.content.decode()
    assert page.status_code == 200
    assert SCRIPT not in html
    assert "\\u003Cscript\\u003Ealert" in html   # json_script's escaping of the completion
    assert 'id="step-slider"' in html
    # and the JSON carries it as text for inspector.js to set with textContent
    completions = [s["completion"] for g in api(operator, run).json()["groups"]
                   for s in g["samples"]]
    assert SCRIPT in completions


def test_the_run_page_links_to_its_samples(operator, run):
    assert f'href="/runs/{run.pk}/samples"' in operator.get(f"/runs/{run.pk}").content.decode()


def test_a_page_without_samples_says_so(operator, run):
    page = operator.get(f"/runs/{run.pk}/samples").content.decode()

    assert "No samples yet" in page
