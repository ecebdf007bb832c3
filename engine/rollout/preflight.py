"""Preflight: are the engine's logprobs of the distribution it actually sampled?

At run start, at the configured temperature, a few prompts are generated and the engine's
per-token logprobs are compared with the learner's teacher-forced recompute twice:

    tempered    log_softmax(logits / T), top-p renormalized   what correct (processed)
                                                              behaviour logprobs equal
    untempered  log_softmax(logits)         what raw logprobs (the TRL #4159 bug) equal

If the engine is closer to the untempered one, importance ratios and the logprob gap are
wrong by a temperature-dependent amount every step; the run refuses to start (or warns,
when rollout.preflight = "warn", to rehearse the bug). At T in {0, 1} the two coincide
and the check is skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.experience import Sample
from engine.learner.batch import pack, response_logprobs
from engine.model import encode_prompt
from engine.rollout.base import SamplingParams
from engine.tasks import Problem


class PreflightError(RuntimeError):
    pass


@dataclass(frozen=True)
class PreflightResult:
    skipped: bool
    gap_tempered: float = 0.0      # max |engine - learner(T)|
    gap_untempered: float = 0.0    # max |engine - learner(1)|

    @property
    def scaled(self) -> bool:
        return self.skipped or self.gap_tempered <= self.gap_untempered


def check_logprob_semantics(engine, policy: torch.nn.Module, tokenizer, prompts: list[str],
                            params: SamplingParams, pad_id: int, seed: int) -> PreflightResult:
    if params.temperature in (0.0, 1.0):
        return PreflightResult(skipped=True)
    ids = [encode_prompt(tokenizer, p) for p in prompts]
    outs = engine.generate(ids, params, seed)
    samples = [Sample(Problem(p, ""), i, o.token_ids, o.logprobs, o.finished, o.version, 0)
               for p, i, o in zip(prompts, ids, outs, strict=True) if o.token_ids]
    batch = pack(samples, pad_id)
    mask = batch.response_mask.bool()
    was_training = policy.training
    policy.eval()
    with torch.no_grad():
        tempered, _ = response_logprobs(policy, batch, params.temperature,
                                        top_p=params.top_p)
        untempered, _ = response_logprobs(policy, batch, 1.0)
    policy.train(was_training)
    beh = batch.behaviour_logp
    return PreflightResult(
        skipped=False,
        gap_tempered=float((beh - tempered).abs()[mask].max()),
        gap_untempered=float((beh - untempered).abs()[mask].max()))


def preflight_verdict(res: PreflightResult, rollout) -> tuple[str, str]:
    """(message, log level) for the run's log; "" when skipped. Raises PreflightError on
    unscaled logprobs unless ``rollout.preflight = "warn"``."""
    if res.skipped:
        return "", "info"
    msg = (f"preflight at T={rollout.temperature}: engine logprobs differ from the learner's "
           f"tempered recompute by <= {res.gap_tempered:.2e}, untempered by <= "
           f"{res.gap_untempered:.2e}")
    if res.scaled:
        return msg, "info"
    fix = ('set rollout.logprobs_mode = "processed_logprobs"' if rollout.type == "vllm"
           else "the rollout backend returns raw logprobs")
    text = f"{msg}: logprobs are NOT temperature-scaled; {fix}"
    if rollout.preflight == "error":
        raise PreflightError(text + ' (rollout.preflight = "warn" only warns)')
    return text, "warning"
