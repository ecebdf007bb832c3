"""jobs.fastjson: orjson where it agrees with the json module, the json module where not."""

import json
import math

import pytest

from jobs import fastjson

TEXTS = [
    '{"a": 1, "b": [1.5, -0.0, null, true], "c": "é\\u00e9"}',
    '{"loss": NaN, "x": Infinity, "y": -Infinity}',   # json's literals, which orjson refuses
    '[' * 2000 + ']' * 2000,                            # past orjson's nesting limit
    '{"dup": 1, "dup": 2}',
]


@pytest.mark.parametrize("text", TEXTS)
def test_loads_decodes_what_the_json_module_does(text):
    for given in (text, text.encode(), text.encode("utf-16")):
        try:
            expected = json.loads(given)
        except RecursionError:
            with pytest.raises(RecursionError):
                fastjson.loads(given)
            continue
        got = fastjson.loads(given)
        assert json.dumps(got, sort_keys=True) == json.dumps(expected, sort_keys=True)


def test_an_integer_past_64_bits_is_a_float_of_its_value_and_ingest_refuses_it_as_a_seq():
    from jobs.ingest.batch import parse_event_batch

    assert fastjson.loads('{"n": 123456789012345678901234567890}') == {"n": 1.2345678901234568e29}
    batch = parse_event_batch(b'{"events": [{"type": "log", "seq": 123456789012345678901234567890'
                              b', "ts": 1.0, "level": "info", "message": "m"}]}')
    assert not batch.events and "seq" in batch.errors[0]["error"]


def test_loads_raises_the_json_modules_errors():
    for bad in ('{"a": ', b"\xff\xfe\xfa", "[1, 2"):
        with pytest.raises(ValueError) as ours:
            fastjson.loads(bad)
        with pytest.raises(ValueError) as theirs:
            json.loads(bad)
        assert str(ours.value) == str(theirs.value)


def test_dumps_writes_json_the_json_module_reads_back_the_same():
    value = {"values": {"reward/mean": 0.1, "tiny": 5e-324, "big": 1e300}, "seq": 2**62,
             "huge": 2**70, 1: "int key", "list": [None, True, "\n\t\\"]}
    text = fastjson.dumps(value)
    assert isinstance(text, str)
    assert json.loads(text) == {**{k: v for k, v in value.items() if k != 1}, "1": "int key"}
    assert math.copysign(1, json.loads(fastjson.dumps({"z": -0.0}))["z"]) == -1
