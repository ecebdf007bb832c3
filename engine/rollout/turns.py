"""How a trajectory's messages become its context's tokens, turn by turn.

    opening = turns.opening(env.reset(row))          the prompt the first turn continues
    loop:
        turn = the model's tokens (they end on EOS, the end-of-turn token or Env.stop)
        context += turn                                              (loss mask 1)
        context += turns.after(turn, observations)                   (loss mask 0)

Without a chat template (the built-in model) messages are their contents, concatenated.
With one, the opening is the template's rendering of the reset's messages with its
generation prompt, and what follows a model turn is the template's own: rendered once as
a placeholder conversation that ends on an assistant message, then again with the
observations and the next generation prompt after it; the difference is what the
observations add (veRL's agent loop and SkyRL render the tool messages the same way).
The model's tokens are never re-rendered: its turn is kept as sampled (behaviour
logprobs stay aligned), and what the template closes an assistant message with
(``<|im_end|>\\n``) is appended, less the end-of-turn token when the model wrote it.
"""

from __future__ import annotations

from engine.envs.base import Message, render
from engine.model import chat_prompt, encode_prompt, end_of_turn_token_id

_PROBE = "rlplane-turn-probe"
_BEFORE: list[Message] = [{"role": "user", "content": "1"},
                          {"role": "assistant", "content": _PROBE}]


class TurnTemplate:
    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        if self.chat:
            self.eot = end_of_turn_token_id(tokenizer)
            self._before = tokenizer.apply_chat_template(_BEFORE, tokenize=False)
            at = self._before.rfind(_PROBE)
            if at < 0:
                raise ValueError("the tokenizer's chat template drops an assistant "
                                 "message's content; a multi-turn task cannot render "
                                 "turns with it")
            self._close = self._before[at + len(_PROBE):]     # e.g. "<|im_end|>\n"

    def opening(self, messages: list[Message]) -> list[int]:
        if not self.chat:
            return encode_prompt(self.tok, render(messages))
        return encode_prompt(self.tok, chat_prompt(self.tok, messages))

    def after(self, turn: list[int], observations: list[Message]) -> list[int]:
        """The tokens that follow the model's ``turn``: the close of its message, the
        observations and the generation prompt of the next turn (with a template)."""
        if not self.chat:
            return self._ids(render(observations))
        rendered = self.tok.apply_chat_template(_BEFORE + observations, tokenize=False,
                                                add_generation_prompt=True)
        if not rendered.startswith(self._before):
            raise ValueError("the tokenizer's chat template renders a conversation's "
                             "earlier messages differently once more follow; a "
                             "multi-turn task cannot append turns with it")
        ids = self._ids(self._close + rendered[len(self._before):])
        if turn and self.eot is not None and turn[-1] == self.eot and ids[:1] == [self.eot]:
            ids = ids[1:]                   # the model closed its message itself
        return ids

    def _ids(self, text: str) -> list[int]:
        return self.tok(text, add_special_tokens=False)["input_ids"]
