"""JSON on the hot paths: ingest's request bodies and the payloads it stores, and the
stored payloads the alert rules read back. orjson decodes a metrics event (64 values)
about 4x as fast as the json module here and encodes it about 8x; at 100 runs the json
module's share was about a third of the alert worker's CPU.

Where the two differ, the json module's behaviour is kept but for one case:
    loads   what orjson refuses -- NaN/Infinity literals, text that is not UTF-8, nesting
            past its limit -- goes to json.loads, which decodes it or raises its own
            error (the messages ingest shows). The case: an integer past 64 bits comes
            back a float (orjson's), not an int. Ingest refuses it as a seq, step or
            version either way (past 2**53 - 1, jobs.ingest.batch: "expected an
            integer" then) and stores metric values as floats; finding such digits
            first cost more than json.loads of the whole body.
    dumps   a str; keys that are not strings written as strings (OPT_NON_STR_KEYS); an
            integer past 64 bits through json.dumps. Stored payloads hold no NaN
            (jobs.ingest.batch.json_safe), where orjson writes null and json NaN.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def loads(text: str | bytes) -> Any:
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def dumps(value: Any) -> str:
    try:
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:
        return json.dumps(value)
