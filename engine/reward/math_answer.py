"""Math answers with ``math-verify``: read the final answer of a text, compare it with a
reference answer, say why.

    gold_answer("... so 3+4=<<3+4=7>>7 pens\\n#### 7")   # [7, '7']: after GSM8K's ####
    verdict_of(answer, completion, penalty)          # Verdict(1.0, "correct"), ...

    GSM8K: a ``#### x`` line wins (what follows the last ####); otherwise math-verify's
    own extraction: \\boxed{...}, "final answer is ...", LaTeX ($\\frac{1}{2}$), plain
    expressions and numbers (the last one in the text).

    reasons: correct 1.0 | wrong 0.0 | no_answer -penalty (nothing to read) |
             gold_unparsed 0.0 (the reference itself has no readable answer)

math-verify bounds parsing and comparing with SIGALRM, which only works in a process's
main thread: elsewhere (a threaded actor) it runs unbounded rather than failing.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from engine.reward.verdict import Verdict

GSM8K_MARK = "####"


def _timeout(seconds: int) -> int | None:
    return seconds if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, timeout_s: int) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse

    return parse(text, [LatexExtractionConfig(), ExprExtractionConfig()],
                 parsing_timeout=_timeout(timeout_s))


def _marked(text: str) -> str:
    """What follows GSM8K's last ``####``, else the whole text."""
    head, mark, tail = text.rpartition(GSM8K_MARK)
    return tail.strip() if mark else text


@lru_cache(maxsize=65536)
def gold_answer(answer: str, timeout_s: int = 5) -> tuple:
    """The reference answer, parsed (cached: every sample of a group shares it). A bare
    LaTeX answer without delimiters (``\\dfrac{3}{4}``) is read as math too."""
    text = _marked(answer)
    parsed = _parse(text, timeout_s)
    if not parsed and text:
        parsed = _parse(f"${text}$", timeout_s)
    return tuple(parsed)


def completion_answer(text: str, timeout_s: int = 5) -> list:
    return _parse(_marked(text), timeout_s)


def equivalent(gold: tuple, pred: list, timeout_s: int = 5) -> bool:
    from math_verify import verify

    return verify(list(gold), pred, timeout_seconds=_timeout(timeout_s))


def verdict_of(answer: str, text: str, penalty: float, timeout_s: int = 5) -> Verdict:
    gold = gold_answer(answer, timeout_s)
    if not gold:
        return Verdict(0.0, "gold_unparsed")
    pred = completion_answer(text, timeout_s)
    if not pred:
        return Verdict(-penalty, "no_answer")
    return Verdict(1.0, "correct") if equivalent(gold, pred, timeout_s) else Verdict(0.0, "wrong")


class MathVerifier:
    """The ``reward.type = "math"`` judge (a completion cut off by the budget scores
    -format_penalty, reason "unfinished", as with every verifier)."""

    kind = "math"

    def __init__(self, cfg, task):
        self.task, self.timeout_s = task, cfg.timeout_s

    def judge(self, problem, text: str, finished: bool) -> Verdict:
        if not finished:
            return Verdict(-self.task.format_penalty, "unfinished")
        return verdict_of(problem.answer, text, self.task.format_penalty, self.timeout_s)
