"""s/step of TRL's GRPOTrainer vs rlplane's engine: one recipe, one model, one process.

Both sides train the demo recipe (configs/demo_arithmetic.toml: 2-digit addition, 16
prompts x 8 completions, 8 new tokens, temperature 1.0, AdamW lr 1e-4 constant, one
optimizer step per batch, fp32, KL beta 0) from the same warm-started model directory
(engine.learner.warmstart.ensure_warm_start: an HF Llama with the char tokenizer;
TRL gets it from engine.model's loaders, rlplane as its model.path), scored by the
arithmetic task's own ``Task.score``, on the same prompts (``train_problems(step, 16)``
for step 0, 1, ...), with ``torch.set_num_threads(--threads)`` on both. TRL is set to
rlplane's GRPO defaults: loss_type "dapo" (token-mean over the batch: rlplane's
loss_agg_mode "token-mean"), scale_rewards "group" (normalize_std), epsilon 0.2, beta 0,
max_grad_norm 1.0, weight decay 0, num_iterations 1, per-device batch 128, gradient
accumulation 1, no vLLM, no eval, logging or saving. Both step torch's fused AdamW
(TRL: transformers' default optim, adamw_torch_fused; rlplane: engine.learner.device.adamw).

    round r:  TRL  [warm-up step][K timed steps]   rlplane [warm-up step][K timed steps]
    (the first of the two alternates by round, so machine noise hits both)

Each round builds each side afresh from the warm start (model load and trainer setup
are not timed). s/step is the median over rounds of a round's mean step time:
TRL's from a TrainerCallback (on_step_begin .. on_step_end), rlplane's from its own
``time/step_s`` metric (run_local's MetricsEvents, via a MemorySink).

    ratio = TRL s/step / rlplane s/step      (> 1: rlplane is faster)

The splits: rlplane's time/{rollout,reward,learner,weight_sync}_s; TRL's generation
(``GRPOTrainer._generate``: tokenize, ``model.generate``, decode), reward
(``_calculate_rewards``) and the rest of the step (old/new logprobs, loss, backward,
optimizer). With one optimizer step per batch neither side runs a separate recompute
of the old logprobs: both take them from the update's own forward (rlplane's
Learner.fuses_recompute; TRL's detached per-token logprobs at num_iterations 1).

Two more sides, "idle" and "split": rlplane's one-step-off in the same single process,
the next batch generated on a thread of its own (placement.overlap_threads =
--overlap-threads, half of --threads by default) while the learner updates, the two
sharing the cores as placement.overlap_share says: "idle", the learner keeping every core
and the rollout thread at the lowest CPU priority (the cycles the update leaves idle);
"split", the learner keeping the rest at equal priority. Each trains on samples one
version old (staleness 1), so its ratio is a throughput ratio at that staleness, not the
same algorithm as TRL's on-policy step.

    PYTHONPATH=. .venv/bin/python bench/vs_trl.py [--rounds 3] [--steps-per-round 4]
        [--threads 2] [--overlap-threads 1] [--compile] [--quick]

Measured with the defaults (3 rounds x 4 steps, 2 threads; trl 1.16.0; this project's
shared 2-core box, 2026-12-03), two runs of the bench:

    load average 0.6-1.3      trl 0.292 s/step (generation 0.076 + reward 0.001 +
                              update 0.216), rlplane 0.229 (rollout 0.059 + reward
                              0.001 + learner 0.158 + weight_sync 0.004): ratio 1.27
    another 2-thread test     trl 6.890 s/step (generation 2.749 + update 4.141),
    running alongside         rlplane 6.287 (rollout 2.384 + learner 3.952): ratio 1.10

and with the overlapped side (2026-12-03 evening, load average 1.6: one other job):

    trl 0.200 s/step, rlplane 0.175 (ratio 1.14), rlplane one_step_off on a thread of
    its own with 1 of the 2 torch threads 0.227 (ratio 0.88: generation 0.043 -> 0.077 s
    and the update 0.120 -> 0.213 s with half the threads each, more than the overlap
    hides; with the learner kept at 2 threads, 0.201, ratio 1.00)

On 2026-12-04 (an AMD EPYC 2-core box, load average 0.7-1.1), three runs of the defaults
after the sampler prefilled a group's prompt once and the learner computed it once:
trl 0.205 / 0.215 / 0.209 s/step (generation ~0.053 + update ~0.155), rlplane 0.094 /
0.098 / 0.091 (rollout 0.027-0.028 + learner 0.054-0.060): ratios 2.17, 2.19, 2.29
(median 2.19; 1.19 before those two changes); overlapped one-step-off 1.78, 1.79, 1.90.
With --compile, learner.compile adds ~2 % (2.25 against 2.20 in one run).

The same day, three runs of the defaults once the overlapped side ran at both shares
(placement.overlap_share; load average 1.7-2.2): trl 0.270-0.272 s/step, rlplane
0.113-0.116 (ratios 2.35, 2.36, 2.40), "idle" 0.083-0.089 (3.26, 3.05, 3.06: the update
0.073-0.079 s, as in the sync run, generation 0.076-0.082 s in its gaps), "split"
0.132-0.137 (2.05, 1.96, 2.06).

Two 2-thread jobs on 2 cores slow both sides ~25x (their threads wait on each other),
so each round's line prints the load average: read a ratio together with it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path

import torch

from engine.api import MetricsEvent, run_local
from engine.config import RunConfig, load_config, validate_config
from engine.learner.warmstart import ensure_warm_start
from engine.model import load_policy, load_tokenizer
from engine.tasks import Problem, build_task
from engine.telemetry.sinks import MemorySink

ROOT = Path(__file__).parents[1]
RLPLANE_PHASES = ("rollout", "reward", "learner", "weight_sync")


def recipe(steps: int, quick: bool) -> RunConfig:
    """The demo's config, for ``steps`` steps with nothing else in them: no eval, no
    mid-run checkpoint, no time bound. Its warm start gets the longest time bound there
    is (not part of its cache key): one cut short on a busy box is not cached, and this
    bench needs the one the demo starts from. --quick: the base model (no warm start)
    and a batch of 4 prompts x 2 completions."""
    data = load_config(ROOT / "configs" / "demo_arithmetic.toml").model_dump(mode="json")
    data.update(steps=steps, max_seconds=None, name="bench-vs-trl")
    data["telemetry"].update(eval_every_steps=0, jsonl=False)
    data["checkpoint"]["every_steps"] = 0
    data["warm_start"]["max_seconds"] = 3600
    if quick:
        data["warm_start"]["steps"] = 0
        data["rollout"]["prompts_per_step"] = 4
        data["algorithm"]["group_size"] = 2
    return validate_config(data)


# placement.overlap_share: how the overlapped side's rollout thread shares the cores
SHARES = {"idle": "the learner keeping every core, the rollout at nice 19",
          "split": "the learner keeping the rest"}


def starting_from(cfg: RunConfig, model_dir: Path, overlap_threads: int = 0,
                  compile: bool = False, share: str = "idle") -> RunConfig:
    """cfg's run from ``model_dir`` as a model.path, warm start off: rlplane loads the
    very directory TRL does, not another warm start of its own. ``overlap_threads``:
    one-step-off in the same process, the rollout worker on a thread of its own with
    that many torch threads (placement.overlap_threads), sharing the cores as ``share``
    says (placement.overlap_share). ``compile``: learner.compile (its compile falls in
    the untimed warm-up step)."""
    data = cfg.model_dump(mode="json")
    data["model"].update(size=None, path=str(model_dir))
    data["warm_start"]["steps"] = 0
    data["learner"]["compile"] = compile
    if overlap_threads:
        data["async_policy"] = {"type": "one_step_off"}
        data["placement"] = {"type": "colocated", "overlap_threads": overlap_threads,
                             "overlap_share": share}
    return validate_config(data)


def time_rlplane(cfg: RunConfig) -> dict[str, list[float]]:
    """Per-step seconds of one rlplane run, the warm-up step left out."""
    sink = MemorySink()
    with tempfile.TemporaryDirectory() as out:
        run_local(cfg, out, sink=sink)
    rows = [e.values for e in sink.events
            if isinstance(e, MetricsEvent) and "time/step_s" in e.values][1:]
    return {"step": [m["time/step_s"] for m in rows],
            **{p: [m[f"time/{p}_s"] for m in rows] for p in RLPLANE_PHASES}}


def time_trl(cfg: RunConfig, model_dir: Path, threads: int) -> dict[str, list[float]]:
    """Per-step seconds of one TRL GRPOTrainer run of cfg's recipe, warm-up step left out."""
    from datasets import Dataset
    from transformers import PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    task = build_task(cfg.task)
    tok = load_tokenizer(model_dir)
    alg, roll = cfg.algorithm, cfg.rollout
    problems = [p for step in range(cfg.steps)
                for p in task.train_problems(step, roll.prompts_per_step)]
    spans: dict[str, list[float]] = {"step": [], "generation": [], "reward": []}

    def arithmetic(prompts, completions, completion_ids, answer, **kwargs) -> list[float]:
        # finished: the completion ended with EOS inside the budget (TRL keeps that EOS
        # in completion_ids and decodes without it), as rlplane's sampler reports it
        return [task.score(Problem(prompt=p, answer=a), text,
                           finished=bool(ids) and ids[-1] == tok.eos_token_id)
                for p, text, ids, a in zip(prompts, completions, completion_ids, answer,
                                           strict=True)]

    class TimedGRPOTrainer(GRPOTrainer):
        """Adds the seconds of its generation and its scoring to ``spans``."""

        def _generate(self, prompts):
            t0 = time.perf_counter()
            out = super()._generate(prompts)
            spans["generation"].append(time.perf_counter() - t0)
            return out

        def _calculate_rewards(self, *args):
            t0 = time.perf_counter()
            out = super()._calculate_rewards(*args)
            spans["reward"].append(time.perf_counter() - t0)
            return out

    class StepClock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if torch.get_num_threads() != threads:
                raise RuntimeError(f"TRL runs with {torch.get_num_threads()} torch threads, "
                                   f"not the {threads} asked for")
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            spans["step"].append(time.perf_counter() - self.t0)

    with tempfile.TemporaryDirectory() as out:
        args = GRPOConfig(
            output_dir=out, max_steps=cfg.steps, seed=cfg.model.seed, use_cpu=True,
            bf16=False, fp16=False, learning_rate=alg.lr, lr_scheduler_type="constant",
            warmup_steps=0, weight_decay=alg.weight_decay, max_grad_norm=alg.max_grad_norm,
            per_device_train_batch_size=roll.prompts_per_step * alg.group_size,
            gradient_accumulation_steps=1, num_generations=alg.group_size,
            max_completion_length=roll.max_new_tokens, temperature=roll.temperature,
            top_p=roll.top_p, beta=alg.kl_coef, num_iterations=alg.epochs,
            epsilon=alg.clip_low, epsilon_high=alg.clip_high, loss_type="dapo",
            scale_rewards="group", mask_truncated_completions=False, use_vllm=False,
            shuffle_dataset=False, eval_strategy="no", save_strategy="no",
            logging_strategy="no", report_to=[], disable_tqdm=True, log_completions=False,
            dataloader_num_workers=0)
        trainer = TimedGRPOTrainer(
            model=load_policy(model_dir), processing_class=tok, reward_funcs=arithmetic,
            args=args, train_dataset=Dataset.from_dict(
                {"prompt": [p.prompt for p in problems],
                 "answer": [p.answer for p in problems]}),
            callbacks=[StepClock()])
        trainer.remove_callback(PrinterCallback)   # its end-of-training dict of metrics
        torch.set_num_threads(threads)
        trainer.train()
    steps = spans["step"][1:]
    generation, reward = spans["generation"][1:], spans["reward"][1:]
    return {"step": steps, "generation": generation, "reward": reward,
            "update": [s - g - r for s, g, r in zip(steps, generation, reward, strict=True)]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps-per-round", type=int, default=4,
                    help="timed steps per round, after one warm-up step")
    ap.add_argument("--threads", type=int, default=2, help="torch threads, both sides")
    ap.add_argument("--overlap-threads", type=int, default=None,
                    help="rlplane one-step-off with the rollout worker on a thread of its "
                         "own with this many torch threads (default: half of --threads; "
                         "0: leave this side out)")
    ap.add_argument("--compile", action="store_true",
                    help="a fourth side: rlplane with learner.compile (TRL left as it is)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke test: 1 round of 1 step, base model, 4 prompts x 2")
    args = ap.parse_args()
    rounds, k = (1, 1) if args.quick else (args.rounds, args.steps_per_round)
    overlap = args.threads // 2 if args.overlap_threads is None else args.overlap_threads
    cfg = recipe(k + 1, args.quick)
    torch.set_num_threads(args.threads)
    model_dir = ensure_warm_start(cfg)
    sides = {"trl": lambda: time_trl(cfg, model_dir, args.threads),
             "rlplane": lambda: time_rlplane(starting_from(cfg, model_dir))}
    for share in SHARES if overlap else ():
        sides[share] = partial(lambda sh: time_rlplane(
            starting_from(cfg, model_dir, overlap, share=sh)), share)
    if args.compile:
        sides["compiled"] = lambda: time_rlplane(starting_from(cfg, model_dir, compile=True))
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in sides}
    for r in range(rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for side in order:
            torch.set_num_threads(args.threads)
            per_step = sides[side]()
            runs[side].append({key: statistics.fmean(v) for key, v in per_step.items()})
            print(f"round {r}: {side:8s} {runs[side][-1]['step']:.3f} s/step  (load average "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)

    def med(side: str, key: str) -> float:
        return statistics.median(m[key] for m in runs[side])

    r = cfg.rollout
    print(f"\n{cfg.name}: {r.prompts_per_step} prompts x {cfg.algorithm.group_size}, "
          f"{r.max_new_tokens} new tokens, {args.threads} torch thread(s), {rounds} round(s) "
          f"x {k} step(s) after a warm-up step; medians over rounds; model {model_dir.name}")
    print(f"  trl      {med('trl', 'step'):.3f} s/step  (generation "
          f"{med('trl', 'generation'):.3f} + reward {med('trl', 'reward'):.3f} + update "
          f"{med('trl', 'update'):.3f})")
    split = " + ".join(f"{p} {med('rlplane', p):.3f}" for p in RLPLANE_PHASES)
    print(f"  rlplane  {med('rlplane', 'step'):.3f} s/step  ({split} + rest)")
    print(f"  ratio trl / rlplane {med('trl', 'step') / med('rlplane', 'step'):.2f}  "
          f"(> 1: rlplane is faster)")
    for share, how in SHARES.items() if overlap else ():
        split = " | ".join(f"{p} {med(share, p):.3f}" for p in RLPLANE_PHASES)
        print(f"  rlplane one_step_off, rollout on a thread of its own with {overlap} torch "
              f"thread(s), {how}: {med(share, 'step'):.3f} s/step  ({split}; the phases "
              f"overlap)")
        print(f"  ratio trl / rlplane overlapped ({share}) "
              f"{med('trl', 'step') / med(share, 'step'):.2f}  (staleness 1, TIS as "
              f"configured)")
    if args.compile:
        split = " + ".join(f"{p} {med('compiled', p):.3f}" for p in RLPLANE_PHASES)
        print(f"  rlplane with learner.compile: {med('compiled', 'step'):.3f} s/step  ({split}"
              f" + rest)")
        print(f"  ratio trl / rlplane compiled {med('trl', 'step') / med('compiled', 'step'):.2f}"
              f"  (TRL uncompiled, its default)")


if __name__ == "__main__":
    main()
