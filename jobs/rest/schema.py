"""The error answers every operation declares, added to the generated schema in one place
(a drf-spectacular postprocessing hook), so the schema cannot forget one a view inherits:

    401  no token, or one unknown or revoked           every operation
    403  the token's user lacks the role (viewers      every operation (a browser session
         only read)                                    without its CSRF token, too)
    404  no such run / alert / preset (or a path        an operation with a path parameter
         whose id is not an integer)
    400  a bad query parameter or body field           an operation with either
    413  the body is over the request size limit       an operation with a body

Each is the JSON error shape (Error: {"detail", "errors"?: [{"field", "message"}]}); a
409 is declared by the operations whose action a run's state can refuse. Path ids are
integers from 0 to 2**63 - 1, as the database holds them.

A live control's body is the engine's own schema of its controls (engine.api.Control, a
union keyed on ``kind``): one branch per kind, each with the value it needs and that
value's bounds, so the schema says what validate_control accepts.
"""

from pydantic import TypeAdapter

from engine.api import Control
from jobs.rest.runs import MAX_ID

VALUE_KEYWORDS = ("type", "minimum", "maximum", "description")

WHY = {
    "400": "a query parameter or body field is invalid: each in errors, with the fix",
    "401": "no API token, or one that is unknown or revoked",
    "403": "your role does not allow this (viewers only read)",
    "404": "no such object",
    "413": "the request body is over the size limit",
}


def control_request() -> dict:
    """The engine's control union as OpenAPI 3.0: its JSON Schema 2020 exclusive bounds
    (a number) become 3.0's boolean form; the engine's own fields (id, requested_by) are
    not the API's to send."""
    branches = []
    for model in TypeAdapter(Control).json_schema()["$defs"].values():
        props = model["properties"]
        branch = {"type": "object", "additionalProperties": False,
                  "properties": {"kind": {"type": "string",
                                          "enum": [props["kind"]["const"]]}},
                  "required": ["kind", *(["value"] if "value" in model.get("required", ())
                                         else [])]}
        if "value" in props:
            value = {k: props["value"][k] for k in VALUE_KEYWORDS if k in props["value"]}
            for bound, name in (("exclusiveMinimum", "minimum"),
                                ("exclusiveMaximum", "maximum")):
                if bound in props["value"]:
                    value[name], value[bound] = props["value"][bound], True
            branch["properties"]["value"] = value
        branches.append(branch)
    return {"oneOf": branches, "description": "a live control: its kind and, for "
            "set_lr, set_eval_every and set_rollout_workers, the value (engine.api.Control)"}


def declare_errors(result, generator, request, public):
    error = {"content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/Error"}}}}
    for item in result.get("paths", {}).values():
        for op in item.values():
            params = op.get("parameters", [])
            codes = ["401", "403"]
            if any(p["in"] == "path" for p in params):
                codes.append("404")
            if any(p["in"] == "query" for p in params) or "requestBody" in op:
                codes.append("400")
            if "requestBody" in op:
                codes.append("413")
            for code in codes:
                op["responses"].setdefault(code, {**error, "description": WHY[code]})
            for p in params:
                if p["in"] == "path" and p["schema"].get("type") == "integer":
                    p["schema"].update(minimum=0, maximum=MAX_ID)
    schemas = result.get("components", {}).get("schemas", {})
    if "ControlRequest" in schemas:
        schemas["ControlRequest"] = control_request()
    # A config comes as toml or as config, never both (ConfigInput.validate); a launch
    # needs one, a fork may send neither (the parent's config).
    if "Launch" in schemas:
        schemas["Launch"]["oneOf"] = [{"required": ["toml"]}, {"required": ["config"]}]
    if "Fork" in schemas:
        schemas["Fork"]["not"] = {"required": ["toml", "config"]}
    return result
