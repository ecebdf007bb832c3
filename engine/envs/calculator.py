"""The built-in tool environment: a calculator the policy may call before it answers.

In the built-in model's alphabet (digits, + - * = :, a-z, space), one trajectory reads

    37*48:          the prompt (reset): the problem and the ':' that hands over the turn
    37*48=          the model's tool call, an expression; '=' ends the turn (Env.stop)
    1776:           the observation: the calculator's result, then ':' (never trained on)
    1776<eos>       the model's answer; EOS ends the turn and the step scores it

or, without the tool, ``37*48:`` then ``1776<eos>``. Two-digit products are more than the
tiny model computes in its head, so answering through the tool is what pays; the warm
start imitates it in ``demo_tool_frac`` of its demonstrations (the others answer
directly), which leaves RL the tool-call rate to raise.
"""

from __future__ import annotations

import random
import re
from typing import Any

from engine.envs.base import Message, StepResult

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
CALL = re.compile(r"(\d{1,6})([+\-*])(\d{1,6})=")
ANSWER = re.compile(r"-?\d{1,12}")


class CalculatorEnv:
    stop = ("=",)

    def __init__(self, digits: int = 2, ops: str = "*", demo_tool_frac: float = 0.3,
                 format_penalty: float = 0.1):
        if not ops or set(ops) - set(OPS):
            raise ValueError(f"ops={ops!r}: use some of {''.join(OPS)}")
        self.digits, self.ops = digits, ops
        self.demo_tool_frac, self.format_penalty = demo_tool_frac, format_penalty
        self.answer = ""

    def draw(self, rng: random.Random) -> dict[str, Any]:
        lo, hi = 10 ** (self.digits - 1), 10 ** self.digits - 1
        a, b, op = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(self.ops)
        return {"a": a, "op": op, "b": b, "answer": str(OPS[op](a, b))}

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.answer = row["answer"]
        return [{"role": "user", "content": f"{row['a']}{row['op']}{row['b']}:"}]

    def step(self, text: str) -> StepResult:
        if text.endswith("="):                       # a tool call
            call = CALL.fullmatch(text)
            if call is None:
                return StepResult([], -self.format_penalty, True, {"reason": "format"})
            a, op, b = int(call[1]), call[2], int(call[3])
            return StepResult([{"role": "tool", "content": f"{OPS[op](a, b)}:"}], 0.0, False,
                              {"tool_call": True})
        if ANSWER.fullmatch(text) is None:
            return StepResult([], -self.format_penalty, True, {"reason": "format"})
        correct = text == self.answer
        return StepResult([], 1.0 if correct else 0.0, True,
                          {"reason": "correct" if correct else "wrong"})

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        answer = {"role": "assistant", "content": row["answer"]}
        if rng.random() >= self.demo_tool_frac:
            return [answer]
        return [{"role": "assistant", "content": f"{row['a']}{row['op']}{row['b']}="},
                {"role": "tool", "content": f"{row['answer']}:"}, answer]
