"""The API's JSON body parser: DRF's, with the nesting bounded and NUL refused
(jobs.untrusted), each a 400 that names the field."""

from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.parsers import JSONParser

from jobs.untrusted import MAX_DEPTH, storable_problem


class BoundedJSONParser(JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:  # json's C decoder stops at the interpreter's recursion limit
            raise ParseError(f"JSON parse error - nested deeper than {MAX_DEPTH} "
                             "levels") from None
        problem = storable_problem(data)
        if problem is not None:
            raise ValidationError({problem[0]: problem[1]})
        return data
