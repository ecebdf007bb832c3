"""`rlplane watch RUN`: the run's vital signs in the terminal, polled from the API.

    #12 demo_arithmetic  running            step 41
    reward 0.62   held-out 0.58   bubble 0.31   rollout share 0.64
    staleness 0.0 (max 0)   sync latency 0.012 s
    open alerts: BubbleHigh at step 38 -- the learner waited ...

On a terminal the table redraws in place (rich Live); piped, each new step is one line of
name=value pairs, for scripts and logs.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.live import Live
from rich.table import Table

from engine import metrics as M
from rlplane.client import EXIT_OK, EXIT_RUN_FAILED, Client
from rlplane.terminal import inert, plain

# (label, metric): the canonical metrics an operator watches first.
SHOWN = [
    ("reward", M.REWARD_MEAN),
    ("held-out reward", M.EVAL_REWARD_MEAN),
    (M.BUBBLE, M.BUBBLE),                       # shown under its own name
    ("rollout share", M.ROLLOUT_SHARE),
    ("staleness", M.STALENESS_MEAN),
    ("staleness max", M.STALENESS_MAX),
    ("sync latency s", M.WEIGHT_SYNC_LATENCY_S),
    ("step s", M.TIME_STEP_S),
]
TERMINAL = {"succeeded", "failed", "stopped", "lost"}


def current_step(run: dict) -> int | None:
    steps = [m["step"] for m in run["latest"].values()]
    return max(steps) if steps else None


def value(run: dict, metric: str) -> str:
    point = run["latest"].get(metric)
    if point is None or point["value"] is None:
        return "-"
    return f"{point['value']:.4g}"


def shown_status(run: dict) -> str:
    """The run's status, or "paused" while its driver holds after a pause control."""
    return "paused" if run.get("paused") else run["status"]


def table(run: dict) -> Table:
    grid = Table(title=f"#{inert(run['id'])} {inert(run['name'])}  "
                       f"[bold]{inert(shown_status(run))}[/bold]  "
                       f"step {current_step(run) if current_step(run) is not None else '-'}",
                 show_header=False, expand=False)
    grid.add_column("what")
    grid.add_column("value", justify="right")
    for label, metric in SHOWN:
        grid.add_row(label, value(run, metric))
    if run["status"] == "queued" and run["status_reason"]:
        grid.add_row("queued", inert(run["status_reason"]))
    alerts = run["open_alerts"]
    grid.add_row("open alerts", str(len(alerts)))
    for alert in alerts:
        grid.add_row(inert(f"  {alert['kind']} ({alert['state']})"),
                     inert(plain(alert["cause"])[:100]))
    return grid


def line(run: dict) -> str:
    parts = [f"run={run['id']}", f"status={shown_status(run)}", f"step={current_step(run)}"]
    parts += [f"{metric}={value(run, metric)}" for _, metric in SHOWN]
    parts.append(f"open_alerts={len(run['open_alerts'])}")
    return plain(" ".join(parts))


def watch(client: Client, run_id: int, interval_s: float, steps: int | None,
          console: Console) -> int:
    """Poll until the run ends, or until ``steps`` new steps were seen. Returns the exit
    code: 0, or EXIT_RUN_FAILED when the run ended failed or lost."""
    run = client.get(f"/runs/{run_id}")
    first = current_step(run)
    last_printed = None

    def done(run: dict) -> bool:
        step = current_step(run)
        grown = step is not None and (step - (first if first is not None else -1)) >= steps \
            if steps else False
        return run["status"] in TERMINAL or grown

    if console.is_terminal:
        with Live(table(run), console=console, refresh_per_second=4) as live:
            while not done(run):
                time.sleep(interval_s)
                run = client.get(f"/runs/{run_id}")
                live.update(table(run))
    else:
        while True:
            if current_step(run) != last_printed or run["status"] in TERMINAL:
                console.print(line(run), soft_wrap=True, highlight=False, markup=False)
                last_printed = current_step(run)
            if done(run):
                break
            time.sleep(interval_s)
            run = client.get(f"/runs/{run_id}")
    return EXIT_RUN_FAILED if run["status"] in {"failed", "lost"} else EXIT_OK
