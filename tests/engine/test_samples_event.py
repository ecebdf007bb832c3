"""The samples event's pure parts: which rows are inspected, and the bounds it keeps."""

from engine.events import (
    SAMPLE_TEXT_LIMIT,
    SAMPLE_TOKEN_LIMIT,
    SAMPLES_PER_EVENT,
    RolloutSample,
    SamplesEvent,
    event_from_dict,
)
from engine.telemetry.samples import inspected_rows, logprob


def test_the_first_groups_are_inspected_whole_and_zero_turns_it_off():
    groups = [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]

    assert inspected_rows(groups, 0) == []
    assert inspected_rows(groups, 2) == [0, 1, 2, 3, 4, 5]
    assert inspected_rows(groups, 9) == list(range(9))


def test_a_rollout_keeps_bounded_text_and_tokens():
    n = SAMPLE_TOKEN_LIMIT + 5
    s = RolloutSample(completion="x" * (SAMPLE_TEXT_LIMIT + 10), prompt="a\x00b",
                      tokens=["t"] * n, behaviour_logprobs=[-1.0] * n,
                      learner_logprobs=[-1.0] * n)

    assert len(s.completion) == SAMPLE_TEXT_LIMIT and s.completion.endswith("characters cut]")
    assert s.prompt == "a\\0b"
    assert len(s.tokens) == len(s.behaviour_logprobs) == len(s.learner_logprobs) \
        == SAMPLE_TOKEN_LIMIT


def test_an_event_carries_at_most_its_bound_and_reads_back_from_json():
    event = SamplesEvent(seq=1, step=3, samples=[RolloutSample(group=i)
                                                 for i in range(SAMPLES_PER_EVENT + 3)])

    assert len(event.samples) == SAMPLES_PER_EVENT
    assert event_from_dict(event.to_dict()) == event


def test_a_logprob_that_is_not_finite_is_sent_as_none():
    assert logprob(float("-inf")) is None and logprob(-0.123456) == -0.1235
