"""Writes data/gsm8k_sample/{train,test}.jsonl: GSM8K-format word problems the self-built
tiny model can learn something on.

    python data/make_gsm8k_sample.py        # deterministic: the same files every time

Each row has GSM8K's two columns and one more:

    question   "tom has 3 pens and gets 4 more how many now"
    answer     "tom gets 4 more so has 3+4=<<3+4=7>>7 pens\n#### 7"   (GSM8K format)
    solution   "3+4=7"     the worked solution in the tiny model's alphabet (task.sft_key)

The tiny model's character tokenizer knows only digits, ``+-*=:``, a-z and space
(engine/tinymodel.py), so questions and solutions use nothing else; the answers keep
GSM8K's ``<<...>>`` calculator notes and ``#### n`` line, which the math verifier reads.
One step of small-number arithmetic: a 2.6M-parameter model can learn to copy the two
numbers and add, subtract or multiply them.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parent / "gsm8k_sample"
TRAIN, TEST, SEED = 400, 100, 2026
NAMES = ["tom", "ana", "sam", "lily", "ben", "mia", "joe", "eva", "max", "zoe"]
ITEMS = ["apples", "pens", "cards", "books", "eggs", "shells", "coins", "cups"]

# (question, the words before the calculation, the unit after it) per template. Short:
# the tiny model's cost grows with the prompt, and 2 CPU cores should train it in minutes.
ADD = [("{n} has {a} {i} and gets {b} more how many now", "{n} gets {b} more so has", "{i}"),
       ("{n} reads {a} pages then {b} more how many", "{n} reads", "pages")]
SUB = [("{n} has {a} {i} and gives away {b} how many left", "{n} gives {b} away so has",
        "{i}"),
       ("{n} had {a} {i} and lost {b} how many left", "{n} lost {b} so has", "{i}")]
MUL = [("{n} buys {a} bags of {b} {i} how many in all", "{n} buys", "{i}")]


def calc(a: int, op: str, b: int) -> tuple[int, str, str]:
    """(value, GSM8K calculator note, plain step) of one operation."""
    v = {"+": a + b, "-": a - b, "*": a * b}[op]
    return v, f"{a}{op}{b}=<<{a}{op}{b}={v}>>{v}", f"{a}{op}{b}={v}"


def problem(rng: random.Random) -> dict[str, str]:
    n, i = rng.choice(NAMES), rng.choice(ITEMS)
    kind = rng.choices(["add", "sub", "mul"], weights=[4, 3, 2])[0]
    if kind == "add":
        (q, why, unit), a, b = rng.choice(ADD), rng.randint(1, 9), rng.randint(1, 9)
        value, note, step = calc(a, "+", b)
    elif kind == "sub":
        (q, why, unit), a = rng.choice(SUB), rng.randint(2, 9)
        b = rng.randint(1, a - 1)
        value, note, step = calc(a, "-", b)
    else:
        (q, why, unit), a, b = rng.choice(MUL), rng.randint(2, 5), rng.randint(2, 5)
        value, note, step = calc(a, "*", b)
    fields = dict(n=n, i=i, a=a, b=b)
    return {"question": q.format(**fields),
            "answer": f"{why.format(**fields)} {note} {unit.format(i=i)}\n#### {value}",
            "solution": step}


def main(out: Path = OUT) -> None:
    rng, seen = random.Random(SEED), set()
    rows: list[dict[str, str]] = []
    while len(rows) < TRAIN + TEST:
        row = problem(rng)
        if row["question"] not in seen:          # no prompt in both splits (or twice)
            seen.add(row["question"])
            rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    for name, part in (("train", rows[:TRAIN]), ("test", rows[TRAIN:])):
        with (out / f"{name}.jsonl").open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in part)
    print(f"wrote {TRAIN} train and {TEST} test problems to {out}")


if __name__ == "__main__":
    main()
