"""The README's example reward for a GSM8K-style dataset: [reward] type = "python",
function = "rewards/gsm8k.py:score" (read from the working directory, else this checkout).
The answer is what follows the last "####", checked with math-verify."""

from math_verify import parse, verify


def score(prompt, completion, answer, **row):
    """row: the dataset row's other columns (data_source, extra_info, ...)."""
    tail = completion.rpartition("####")[2]
    return 1.0 if tail and verify(parse(answer), parse(tail)) else 0.0
