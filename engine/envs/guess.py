"""The built-in long-horizon environment: guess a secret number, told "up" or "down".

Its turn count is long-tailed by construction, which is what the async policies are for:
a problem's range is 2^k wide with k drawn geometrically (P(k) ~ tail^k, k <= max_bits),
so most trajectories end in a few turns and a few need many (a binary search takes ~k).
The range starts anywhere in 1..99, so problems differ by their prompts (the held-out
split is by prompt). In the built-in model's alphabet one trajectory reads

    guess 37 100:      the prompt (reset): the secret is in 37..100
    68<eos>            a guess (a model turn ends on EOS)
    up:                the observation: the secret is larger ("down:" smaller)
    84<eos> down: 76<eos> up: 80<eos>         ... reward 1 and done at the secret

Each wrong guess is a per-turn reward: +turn_reward when it lies where the secret may
still be (inside the range and on the side the hints so far point to), 0 when it does
not; a trajectory that finds the secret adds 1. The shaping gives a weak guesser a
signal before it finds secrets (a guess that copies the range's first number is in
range) and rewards using the hints. A guess that is not a number ends the trajectory
with -format_penalty; the max_guesses-th wrong guess ends it, lost (a finished game, not
one cut by the run's budget). No wrong guess costs anything: a trajectory cut by its budget
scores the sum so far, and with a cost per guess (or per out-of-range guess) GRPO taught
the tiny model to stop guessing (turns per trajectory 2.2 -> 1.1, and 10.4 -> 1.5, in 12
steps).
"""

from __future__ import annotations

import random
import re
from typing import Any

from engine.envs.base import Message, StepResult

NUMBER = re.compile(r"\d{1,7}")


class GuessEnv:
    stop = ()

    def __init__(self, max_bits: int = 6, tail: float = 0.6, turn_reward: float = 0.02,
                 format_penalty: float = 0.1, max_guesses: int = 8):
        if not 1 <= max_bits <= 20:
            raise ValueError(f"max_bits={max_bits}: use 1..20")
        if not 0.0 < tail < 1.0:
            raise ValueError(f"tail={tail}: use a value in (0, 1)")
        self.max_bits, self.tail = max_bits, tail
        self.turn_reward, self.format_penalty = turn_reward, format_penalty
        self.max_guesses, self.guesses = max_guesses, 0
        self.secret, self.lo, self.hi = 0, 0, 0

    def draw(self, rng: random.Random) -> dict[str, Any]:
        k = rng.choices(range(1, self.max_bits + 1),
                        weights=[self.tail ** k for k in range(1, self.max_bits + 1)])[0]
        lo = rng.randint(1, 99)
        hi = lo + 2 ** k - 1
        secret = rng.randint(lo, hi)
        return {"lo": lo, "hi": hi, "secret": secret, "answer": str(secret)}

    def reset(self, row: dict[str, Any]) -> list[Message]:
        self.secret, self.lo, self.hi = int(row["secret"]), int(row["lo"]), int(row["hi"])
        self.guesses = 0
        return [{"role": "user", "content": f"guess {row['lo']} {row['hi']}:"}]

    def step(self, text: str) -> StepResult:
        if NUMBER.fullmatch(text) is None:
            return StepResult([], -self.format_penalty, True, {"reason": "format"})
        guess = int(text)
        if guess == self.secret:
            return StepResult([], 1.0, True, {"reason": "found"})
        useful = self.lo <= guess <= self.hi
        self.guesses += 1
        if self.guesses >= self.max_guesses:          # the game's own end: lost, finished
            return StepResult([], self.turn_reward if useful else 0.0, True,
                              {"reason": "out_of_guesses"})
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
        else:
            self.hi = min(self.hi, guess - 1)
        hint = "up:" if guess < self.secret else "down:"
        return StepResult([{"role": "user", "content": hint}],
                          self.turn_reward if useful else 0.0, False, {})

    def demonstration(self, row: dict[str, Any], rng: random.Random) -> list[Message]:
        """A binary search from the range's middle to the secret."""
        lo, hi, secret, out = int(row["lo"]), int(row["hi"]), int(row["secret"]), []
        while True:
            mid = (lo + hi) // 2
            out.append({"role": "assistant", "content": str(mid)})
            if mid == secret:
                return out
            if mid < secret:
                lo = mid + 1
                out.append({"role": "user", "content": "up:"})
            else:
                hi = mid - 1
                out.append({"role": "user", "content": "down:"})
