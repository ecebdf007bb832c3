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
"""

from jobs.rest.runs import MAX_ID

WHY = {
    "400": "a query parameter or body field is invalid: each in errors, with the fix",
    "401": "no API token, or one that is unknown or revoked",
    "403": "your role does not allow this (viewers only read)",
    "404": "no such object",
    "413": "the request body is over the size limit",
}


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
    return result
