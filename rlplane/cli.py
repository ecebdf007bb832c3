"""rlplane: operate runs from a terminal or a script, through the REST API.

    rlplane login URL [--token T]          check the token, keep URL + token (0600)
    rlplane runs [--status S,..] [--all] [--json]
    rlplane launch CONFIG.toml [--set key=value ...] [--priority N] [-q]
    rlplane watch RUN [--interval S] [--steps N]
    rlplane stop RUN                       a queued run is cancelled
    rlplane fork RUN [CONFIG.toml] [--checkpoint ID] [--set key=value ...] [-q]
    rlplane priority RUN N                 a queued run's place in the queue
    rlplane baseline RUN OTHER|none        mark run OTHER as RUN's throughput baseline
    rlplane checkpoint|pause|resume RUN    live controls of a running run, applied after
    rlplane set-lr RUN LR                  the step in progress (`set-eval-every RUN N`:
                                           held-out eval cadence, 0 = none mid-run;
                                           `set-rollout-workers RUN N`: on Ray)
    rlplane logs RUN [--follow]            what the run reported; a command's output ("job")
    rlplane alerts [--run RUN] [--state open|acknowledged|resolved] [--ack ID] [--resolve ID]
    rlplane watch-files --run ID --token T [--url U] [--framework F] PATH...
                                           tail a framework's metric logs, rollout dumps
                                           and TensorBoard files into an external run
    rlplane launch-command --framework F --name N [--cpus C] [--gpus G] [--working-dir D]
                           [--env K=V ...] [--pip PKG ...] [--param K=V ...] -- COMMAND...
                           another framework's training command, queued and run as a Ray job
    rlplane track-run --framework F --name N [--param K=V ...]
                           a run your own process reports to: prints the `export` lines
                           (RLPLANE_URL/RUN_ID/TOKEN, MLFLOW_TRACKING_URI/TOKEN) to eval

Everything printed from the server's answers goes through rlplane.terminal first: a run's
token writes its name, status reasons, log lines and alert causes, and none of it reaches
the terminal as an escape sequence or rich markup. `login` refuses http:// to a host other
than this machine unless --insecure (the token would cross the network in clear).

Exit codes (rlplane.client): 0 ok; 1 server error; 2 bad arguments or input (each bad field
printed as "path: message"); 3 not logged in or token refused; 4 not allowed for your role;
5 not found; 6 the run's state does not allow it; 7 control plane unreachable; 8 `watch`:
the run ended failed or lost. Errors go to stderr; `launch -q` / `fork -q` print only the
new run's id on stdout.
"""

from __future__ import annotations

import argparse
import getpass
import ipaddress
import json
import shlex
import sys
import time
import tomllib
import urllib.parse
from functools import partial
from pathlib import Path

from rich.console import Console
from rich.table import Table

from engine.config import FRAMEWORKS, ConfigError, fork_name, validate_config, validate_external
from rlplane import watch as watching
from rlplane.client import (
    EXIT_OK,
    EXIT_USAGE,
    ApiError,
    Client,
    save_credentials,
)
from rlplane.terminal import inert, plain


class UsageError(ApiError):
    def __init__(self, message: str, errors: list[dict] | None = None):
        super().__init__(message, EXIT_USAGE, errors)


def set_path(data: dict, dotted: str, raw: str) -> None:
    """--set rollout.temperature=0.7: the value as TOML (numbers, booleans, "strings",
    [lists]), else as a bare string."""
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    *tables, key = dotted.split(".")
    node = data
    for name in tables:
        node = node.setdefault(name, {})
        if not isinstance(node, dict):
            raise UsageError(f"--set {dotted}: {name} is not a table")
    node[key] = value


def config_with_overrides(path: Path | None, sets: list[str], base: dict | None = None) -> dict:
    """The TOML file (or ``base``) with each --set applied, validated here first (but
    not its files: they may exist only on the cluster)."""
    data = dict(base or {})
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except OSError as exc:
            raise UsageError(f"{path}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise UsageError(f"{path} is not valid TOML: {exc}") from None
    apply_sets(data, sets, "--set", "rollout.temperature=0.7")
    # Syntax and bounds only: the files a config names must exist where the run's
    # workers run, which is the server's to say (it answers each as a field error).
    return validated(partial(validate_config, check_files=False), data, "invalid run config")


def apply_sets(data: dict, items: list[str], flag: str, example: str) -> None:
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise UsageError(f"{flag} {item!r}: write key=value, e.g. {example}")
        set_path(data, key.strip(), raw.strip())


def validated(validate, data: dict, what: str) -> dict:
    """``data`` once ``validate`` passes it; else UsageError with each field's path."""
    try:
        validate(data)
    except ConfigError as exc:
        raise UsageError(what, [{"field": p, "message": m} for p, m in exc.errors]) from None
    return data


def print_runs(console: Console, runs: list[dict]) -> None:
    grid = Table("id", "name", "framework", "status", "priority", "by", "created", "reason")
    for r in runs:
        grid.add_row(*(inert(x) for x in (
            r["id"], r["name"], r.get("framework", "rlplane"), r["status"], r["priority"],
            r["created_by"] or "", r["created_at"][:19].replace("T", " "),
            plain(r["status_reason"])[:60])))
    console.print(grid)


def announce(console: Console, client: Client, run: dict, verb: str, quiet: bool) -> None:
    if quiet:
        print(plain(run["id"]))
    else:
        page = client.page_url(f"/runs/{run['id']}")
        console.print(plain(f"{verb} run #{run['id']} ({run['status']}): {page}"),
                      highlight=False, markup=False)


LOOPBACK_NAMES = {"localhost", "localhost.localdomain", "ip6-localhost"}


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES or host.lower().endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_transport(url: str, insecure: bool) -> None:
    """http:// to another machine sends the token in clear on every call: refused unless
    --insecure (then said on stderr); https:// and this machine's own addresses pass."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in {"http", "https"} or not parts.hostname:
        raise UsageError(f"{url!r} is not an http(s) URL; e.g. https://rlplane.example.org")
    if parts.scheme == "https" or is_loopback(parts.hostname):
        return
    if not insecure:
        raise UsageError(f"{url} is plain http to another machine: your API token would "
                         "cross the network unencrypted on every call. Use https://, or "
                         "pass --insecure if this network is trusted")
    Console(stderr=True).print(f"rlplane: warning: {plain(url)} is plain http; the token is "
                               "sent unencrypted (--insecure)", markup=False, highlight=False)


def cmd_login(args, console: Console) -> int:
    check_transport(args.url, args.insecure)
    token = args.token
    if token is None:
        prompt = f"API token (create one at {args.url.rstrip('/')}/settings/tokens): "
        token = getpass.getpass(prompt) if sys.stdin.isatty() else sys.stdin.readline()
    token = token.strip()
    if not token:
        raise UsageError("no token given")
    client = Client(args.url, token)
    client.get("/runs", limit=1)  # 401 -> exit 3, nothing saved
    path = save_credentials(client.url, token)
    console.print(plain(f"logged in to {client.url}; token kept in {path}"),
                  highlight=False, markup=False)
    return EXIT_OK


def cmd_runs(args, console: Console, client: Client) -> int:
    runs = client.get("/runs", status=args.status, archived="1" if args.all else None,
                      limit=args.limit)
    if args.json:
        print(json.dumps(runs, indent=2))
    else:
        print_runs(console, runs)
    return EXIT_OK


def cmd_launch(args, console: Console, client: Client) -> int:
    config = config_with_overrides(args.config, args.set)
    run = client.post("/runs", {"config": config, "priority": args.priority})
    announce(console, client, run, "launched", args.quiet)
    return EXIT_OK


def cmd_watch(args, console: Console, client: Client) -> int:
    return watching.watch(client, args.run, args.interval, args.steps, console)


def cmd_stop(args, console: Console, client: Client) -> int:
    run = client.post(f"/runs/{args.run}/stop")
    console.print(plain(f"run #{run['id']} is {run['status']}: {run['status_reason']}"),
                  highlight=False, markup=False)
    return EXIT_OK


def cmd_fork(args, console: Console, client: Client) -> int:
    body: dict = {"priority": args.priority}
    if args.checkpoint is not None:
        body["checkpoint"] = args.checkpoint
    if args.config is not None or args.set:
        base = None
        if args.config is None:  # --set alone: the parent's config with the changes
            base = client.get(f"/runs/{args.run}")["config"]
            base["name"] = fork_name(base["name"])
        body["config"] = config_with_overrides(args.config, args.set, base)
    run = client.post(f"/runs/{args.run}/fork", body)
    announce(console, client, run, "forked", args.quiet)
    return EXIT_OK


def cmd_priority(args, console: Console, client: Client) -> int:
    run = client.post(f"/runs/{args.run}/priority", {"priority": args.priority})
    console.print(plain(f"run #{run['id']}: priority {run['priority']}"), highlight=False,
                  markup=False)
    return EXIT_OK


def cmd_baseline(args, console: Console, client: Client) -> int:
    run = client.post(f"/runs/{args.run}/baseline", {"baseline_run": args.baseline})
    what = f"run #{run['baseline_run']}" if run["baseline_run"] is not None else "the default"
    console.print(plain(f"run #{run['id']}: throughput baseline {what}"), highlight=False,
                  markup=False)
    return EXIT_OK


def baseline_arg(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a run id or none, got {text!r}") from None


def cmd_control(args, console: Console, client: Client) -> int:
    body: dict = {"kind": args.command.replace("-", "_")}
    if getattr(args, "value", None) is not None:   # the commands that take one declare it
        body["value"] = args.value
    control = client.post(f"/runs/{args.run}/controls", body)
    console.print(plain(f"run #{args.run}: control {control['id']} ({body['kind']}) sent; "
                        "it is applied after the step in progress"),
                  highlight=False, markup=False)
    return EXIT_OK


def cmd_logs(args, console: Console, client: Client) -> int:
    """The run's reported log lines (by seq), then a launched command's own output (its
    Ray job's log, marked "job"), each poll."""
    after = after_line = 0
    while True:
        page = client.get(f"/runs/{args.run}/events", type=["log", "run.status", "control.applied"],
                          after_seq=after)
        for event in page["events"]:
            text = event.get("message") or event.get("status", "")
            if event["type"] == "run.status":
                text = f"[status] {event.get('status')} {event.get('message', '')}".rstrip()
            print(plain(f"{event['seq']:>6} {text}", newlines=True))
        after = page["last_seq"]
        output = client.get(f"/runs/{args.run}/job-log", after_line=after_line)
        for line in output["lines"]:
            print(f"{'job':>6} {line['message']}")
        after_line = output["last_line"]
        if not args.follow:
            return EXIT_OK
        if not page["events"] and not output["lines"]:
            if client.get(f"/runs/{args.run}")["status"] in watching.TERMINAL:
                return EXIT_OK
            time.sleep(args.interval)


def cmd_alerts(args, console: Console, client: Client) -> int:
    for alert_id, action in ((args.ack, "acknowledge"), (args.resolve, "resolve")):
        if alert_id is not None:
            alert = client.post(f"/alerts/{alert_id}/{action}")
            console.print(plain(f"alert {alert['id']} is {alert['state']}"),
                          highlight=False, markup=False)
            return EXIT_OK
    alerts = client.get("/alerts", run=args.run, state=args.state)
    grid = Table("id", "run", "kind", "state", "step", "cause")
    for a in alerts:
        grid.add_row(*(inert(x) for x in (a["id"], f"#{a['run']}", a["kind"], a["state"],
                                          a["last_step"], plain(a["cause"])[:80])))
    console.print(grid)
    return EXIT_OK


def cmd_watch_files(args, console: Console) -> int:
    """Until the run is asked to stop (or Ctrl-C): then the run ends stopped (succeeded)."""
    from rlplane import track  # the run's own ingest door, with the run's token
    from rlplane.tail import watch_files

    run = track.init(url=args.url, token=args.token, run_id=args.run)
    console.print(f"watching {len(args.paths)} path(s) into run #{args.run}", highlight=False)
    try:
        watch_files(run, args.paths, args.framework, args.interval,
                    stop=lambda: run.stop_requested)
    except KeyboardInterrupt:
        run.finish(status="succeeded")
        return EXIT_OK
    run.finish(status="stopped", reason="stop asked from rlplane")
    return EXIT_OK


def external_config(args, launch: dict | None = None) -> dict:
    """An external run's config from the arguments, validated here first (each bad field
    printed with its path, exit 2)."""
    params: dict = {}
    apply_sets(params, args.param, "--param", "max_steps=200")
    config = {"name": args.name, "framework": args.framework, "params": params,
              "launch": launch}
    return validated(validate_external, config, "invalid external run")


def command_launch(args) -> dict:
    """The launch section: the command after ``--`` (one argument: a shell command as
    written; several: joined with shell quoting), resources and runtime_env."""
    command = args.entrypoint[1:] if args.entrypoint[:1] == ["--"] else args.entrypoint
    if not command:
        raise UsageError("no command: put it after --, e.g. -- python train.py --lr 1e-6")
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {item!r}: write NAME=value")
        env[key] = value
    return {"entrypoint": command[0] if len(command) == 1 else shlex.join(command),
            "working_dir": args.working_dir, "env": env, "pip": args.pip,
            "cpus": args.cpus, "gpus": args.gpus}


def cmd_launch_command(args, console: Console, client: Client) -> int:
    config = external_config(args, command_launch(args))
    created = client.post("/runs/external", {"config": config, "priority": args.priority})
    announce(console, client, created["run"], "launched", args.quiet)
    return EXIT_OK


def cmd_track_run(args, console: Console, client: Client) -> int:
    """stdout: only the export lines, so that `eval "$(rlplane track-run ...)"` works; the
    run's page goes to stderr."""
    created = client.post("/runs/external", {"config": external_config(args)})
    url, run_id, token = created["ingest_url"], created["run"]["id"], created["token"]
    for name, value in (("RLPLANE_URL", url), ("RLPLANE_RUN_ID", str(run_id)),
                        ("RLPLANE_TOKEN", token), ("MLFLOW_TRACKING_URI", f"{url}/mlflow"),
                        ("MLFLOW_TRACKING_TOKEN", token)):
        print(f"export {name}={shlex.quote(value)}")
    Console(stderr=True).print(f"tracking run #{run_id}: {client.page_url(f'/runs/{run_id}')}"
                               " (the token is shown only now)", highlight=False)
    return EXIT_OK


def add_external_parsers(sub) -> None:
    """launch-command and track-run: runs another framework trains (issue 29)."""
    launch = sub.add_parser("launch-command",
                            help="queue another framework's training command as a Ray job")
    track = sub.add_parser("track-run", help="a run your own process reports to; prints "
                                             "the export lines for its environment")
    for cmd in (launch, track):
        cmd.add_argument("--framework", required=True, choices=FRAMEWORKS)
        cmd.add_argument("--name", required=True)
        cmd.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                         help="the run's own parameters, shown and compared (max_steps=200)")
    launch.add_argument("--cpus", type=float, default=1.0)
    launch.add_argument("--gpus", type=int, default=0)
    launch.add_argument("--working-dir", help="uploaded by Ray as the job's working_dir")
    launch.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    launch.add_argument("--pip", action="append", default=[], metavar="PACKAGE",
                        help="installed by Ray for the job (runtime_env pip)")
    launch.add_argument("--priority", type=int, default=0, help="higher starts first")
    launch.add_argument("-q", "--quiet", action="store_true", help="print only the run id")
    launch.add_argument("entrypoint", nargs=argparse.REMAINDER, metavar="-- COMMAND",
                        help="the training command, after --")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="rlplane", description=__doc__.split("\n")[0],
                                epilog="exit codes: see `pydoc rlplane.cli`",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    login = sub.add_parser("login", help="keep the control plane's URL and your API token")
    login.add_argument("url")
    login.add_argument("--token", help="default: read from the prompt (or stdin)")
    login.add_argument("--insecure", action="store_true",
                       help="allow http:// to another machine (the token travels in clear)")
    runs = sub.add_parser("runs", help="list runs")
    runs.add_argument("--status", help="comma-separated: running,queued,...")
    runs.add_argument("--all", action="store_true", help="archived runs too")
    runs.add_argument("--limit", type=int, default=50)
    runs.add_argument("--json", action="store_true")
    for name in ("launch", "fork"):
        cmd = sub.add_parser(name, help=f"{name} a run")
        if name == "fork":
            cmd.add_argument("run", type=int)
            cmd.add_argument("config", type=Path, nargs="?")
            cmd.add_argument("--checkpoint", type=int, help="checkpoint id; default the latest")
        else:
            cmd.add_argument("config", type=Path)
        cmd.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                         help="override a config field, e.g. rollout.temperature=0.7")
        cmd.add_argument("--priority", type=int, default=0, help="higher starts first")
        cmd.add_argument("-q", "--quiet", action="store_true", help="print only the run id")
    w = sub.add_parser("watch", help="a live view of a run")
    w.add_argument("run", type=int)
    w.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    w.add_argument("--steps", type=int, help="return after this many new steps")
    stop = sub.add_parser("stop", help="stop a run (cancel a queued one)")
    stop.add_argument("run", type=int)
    prio = sub.add_parser("priority", help="change a queued run's priority")
    prio.add_argument("run", type=int)
    prio.add_argument("priority", type=int)
    base = sub.add_parser("baseline", help="mark the run ThroughputRegression compares "
                                           "a run with (none: back to the default)")
    base.add_argument("run", type=int)
    base.add_argument("baseline", type=baseline_arg, metavar="OTHER|none")
    for name, what in (("checkpoint", "write a checkpoint now"),
                       ("pause", "hold after the step in progress"),
                       ("resume", "go on after a pause")):
        cmd = sub.add_parser(name, help=f"{what} (a running run)")
        cmd.add_argument("run", type=int)
    set_lr = sub.add_parser("set-lr", help="the policy's learning rate from the next step")
    set_lr.add_argument("run", type=int)
    set_lr.add_argument("value", type=float, metavar="LR")
    set_eval = sub.add_parser("set-eval-every", help="held-out eval every N steps (0: none)")
    set_eval.add_argument("run", type=int)
    set_eval.add_argument("value", type=int, metavar="N")
    workers = sub.add_parser("set-rollout-workers",
                             help="rollout workers from the next step (a run on Ray)")
    workers.add_argument("run", type=int)
    workers.add_argument("value", type=int, metavar="N")
    logs = sub.add_parser("logs", help="a run's log lines")
    logs.add_argument("run", type=int)
    logs.add_argument("-f", "--follow", action="store_true")
    logs.add_argument("--interval", type=float, default=2.0)
    alerts = sub.add_parser("alerts", help="list, acknowledge or resolve alerts")
    alerts.add_argument("--run", type=int)
    alerts.add_argument("--state", choices=["open", "acknowledged", "resolved"])
    alerts.add_argument("--ack", type=int, metavar="ALERT_ID")
    alerts.add_argument("--resolve", type=int, metavar="ALERT_ID")
    files = sub.add_parser("watch-files", help="tail a framework's files into an external run")
    files.add_argument("paths", nargs="+", metavar="PATH",
                       help="a JSONL metrics log, a rollout-dump folder, TensorBoard files")
    files.add_argument("--run", type=int, help="default: RLPLANE_RUN_ID")
    files.add_argument("--token", help="the run's ingest token; default: RLPLANE_TOKEN")
    files.add_argument("--url", help="the control plane; default: RLPLANE_URL")
    files.add_argument("--framework", choices=FRAMEWORKS,
                       help="the JSONL metrics line format (default: told from each line)")
    files.add_argument("--interval", type=float, default=2.0, help="seconds between polls")
    add_external_parsers(sub)
    return p


COMMANDS = {"runs": cmd_runs, "launch": cmd_launch, "watch": cmd_watch, "stop": cmd_stop,
            "fork": cmd_fork, "priority": cmd_priority, "baseline": cmd_baseline, "logs": cmd_logs,
            "alerts": cmd_alerts, "checkpoint": cmd_control, "pause": cmd_control,
            "resume": cmd_control, "set-lr": cmd_control, "set-eval-every": cmd_control,
            "set-rollout-workers": cmd_control,
            "launch-command": cmd_launch_command, "track-run": cmd_track_run}


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)  # bad arguments: argparse exits 2
    console = Console()
    errors = Console(stderr=True, highlight=False)
    try:
        if args.command == "login":
            return cmd_login(args, console)
        if args.command == "watch-files":      # the run's token, not the user's login
            return cmd_watch_files(args, console)
        return COMMANDS[args.command](args, console, Client.from_credentials())
    except ApiError as exc:
        errors.print(plain(f"rlplane: {exc}"), markup=False)
        for e in exc.errors:
            e = e if isinstance(e, dict) else {"message": e}
            errors.print(plain(f"  {e.get('field', '(request)')}: {e.get('message', '')}"),
                         markup=False)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
