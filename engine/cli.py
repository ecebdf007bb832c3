"""``python -m engine run CONFIG.toml [--steps N] [--out DIR] [--resume]``
``python -m engine plan RUN_DIR [--devices N]``

``run`` runs the RL loop in this process with a live progress bar (reward, step time), then
prints a summary table. Exit status: 0 succeeded or stopped, 1 failed, 2 bad config.

``plan`` fits the what-if planner (engine.planner) on a run directory's config.toml and
events.jsonl and prints what the run would do under each placement and async policy on
N devices (default: the run's). Exit status 2 when the directory cannot be fitted.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine import metrics as M
from engine.config import ConfigError, load_config

KEY_METRICS = [
    M.REWARD_MEAN, M.REWARD_ACCURACY, M.RESPONSE_LENGTH_P50, M.RESPONSE_LENGTH_P99,
    M.TIME_STEP_S, M.ROLLOUT_SHARE, M.BUBBLE, M.THROUGHPUT_TOKENS_PER_S,
    M.LOGPROB_GAP_MEAN, M.LOGPROB_GAP_MAX, M.MOE_ROUTING_AGREEMENT, M.TIS_CLIP_FRAC,
    M.STALENESS_MAX, M.WEIGHT_SYNC_LATENCY_S, M.WEIGHT_SYNC_MATCHED, M.LEARNER_LOSS,
    M.LEARNER_ENTROPY,
    M.CRITIC_VALUE_LOSS, M.CRITIC_EXPLAINED_VARIANCE,                  # PPO runs only
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an RL job from a TOML config")
    run.add_argument("config", type=Path)
    run.add_argument("--steps", type=int, default=None, help="override the config's steps")
    run.add_argument("--out", type=Path, default=None, help="run directory (default runs/NAME)")
    run.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    plan = sub.add_parser("plan", help="what a finished run would do under each placement "
                                       "and async policy")
    plan.add_argument("run_dir", type=Path)
    plan.add_argument("--devices", type=int, default=None,
                      help="devices to plan for (default: the run's own)")
    args = parser.parse_args(argv)
    if args.command == "plan":
        return plan_command(args.run_dir, args.devices)

    try:
        cfg = load_config(args.config)
    except (ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.steps is not None and args.steps < 1:
        print("error: --steps must be >= 1", file=sys.stderr)
        return 2
    out = args.out or Path("runs") / cfg.name

    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from engine.api import run_local

    console = Console()
    total = args.steps or cfg.steps
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(),
                  console=console) as bar:
        task = bar.add_task(cfg.name, total=total, info="warm start / eval ...")

        def progress(step: int, total: int, m: dict[str, float]) -> None:
            bar.update(task, completed=step, info=(
                f"reward {m[M.REWARD_MEAN]:+.3f}  acc {m[M.REWARD_ACCURACY]:.2f}  "
                f"step {m[M.TIME_STEP_S]:.2f}s"))

        try:
            summary = run_local(cfg, out, steps=args.steps, resume=args.resume,
                                progress=progress)
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            return 130
        except Exception as exc:  # the run failed: say why, exit non-zero
            console.print(f"[red]run failed:[/] {type(exc).__name__}: {exc}")
            return 1

    table = Table(title=f"{cfg.name}: {summary.status} after {summary.steps_done} steps "
                        f"({summary.wall_s:.0f}s) -> {out}")
    table.add_column("metric")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    for k in sorted(summary.eval_after):
        table.add_row(k, f"{summary.eval_before.get(k, float('nan')):.3f}",
                      f"{summary.eval_after[k]:.3f}")
    for k in KEY_METRICS:
        if k in summary.last_metrics:
            table.add_row(k, "", f"{summary.last_metrics[k]:.4g}")
    console.print(table)
    return 0 if summary.status in ("succeeded", "stopped") else 1


def plan_command(run_dir: Path, devices: int | None) -> int:
    from engine.planner import FitError, fit_run_dir, format_table, plan_table

    if devices is not None and not 1 <= devices <= 1024:
        print("error: --devices must be between 1 and 1024", file=sys.stderr)
        return 2
    try:
        fit = fit_run_dir(run_dir)
        cfg = load_config(run_dir / "config.toml")
    except (FitError, ConfigError, OSError, KeyError) as exc:
        print(f"error: cannot plan {run_dir}: {exc}", file=sys.stderr)
        return 2
    table = plan_table(fit, cfg, devices)
    i = fit.inputs
    print(f"{cfg.name}: fitted on {fit.steps} steps ({fit.policy}, {fit.shape.label}): "
          f"generate {i.prefill_s * 1e3:.1f} ms + {i.decode_step_s * 1e3:.2f} ms/decode step "
          f"+ {i.decode_row_s * 1e3:.3f} ms/token, reward {i.reward_sample_s * 1e3:.2f} "
          f"ms/sample, learner {i.learner_step_s * 1e3:.1f} ms + "
          f"{i.learner_token_s * 1e3:.3f} ms/token, sync {i.sync_send_s * 1e3:.1f} + "
          f"{i.recv_s * 1e3:.1f} ms")
    print(f"on {table.devices} devices:")
    print(format_table(table))
    print(f"best: {table.summary()}")
    return 0
