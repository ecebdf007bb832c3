"""A private local Ray head (token auth on) for tests that need a real Ray cluster:
`ray start --head --block` in a session of its own, on free ports and in its own temp
dir, killed by that session (never `ray stop`, which kills every Ray on the machine).
``add_node`` joins more nodes on this machine the same way (`ray start --address`), each
in a session and a temp dir of its own, killed with the head."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from ray.job_submission import JobStatus, JobSubmissionClient

from controlplane.processes import free_port

RAY = str(Path(sys.executable).with_name("ray"))


class RayHead:
    def __init__(self, num_gpus: int = 0):
        # Short: Ray's unix socket paths must stay under ~107 characters.
        self.dir = Path(tempfile.mkdtemp(prefix="rlr", dir="/tmp"))
        self.token_path = self.dir / "token"
        self.token_path.write_text(uuid.uuid4().hex + uuid.uuid4().hex)
        self.dashboard = f"http://127.0.0.1:{free_port()}"
        self.address = f"127.0.0.1:{free_port()}"      # the GCS, which other nodes join
        self.nodes: list[subprocess.Popen] = []
        self.node_logs: list[Path] = []
        env = {**os.environ, "RAY_AUTH_MODE": "token",
               "RAY_AUTH_TOKEN_PATH": str(self.token_path)}
        env.pop("RAY_AUTH_TOKEN", None)
        env.pop("RAY_ADDRESS", None)
        self.env = env
        self.log = (self.dir / "head.log").open("w")
        self.proc = subprocess.Popen(
            [RAY, "start", "--head", "--block", f"--port={self.address.rsplit(':', 1)[1]}",
             "--node-ip-address=127.0.0.1", "--num-cpus=2",
             f"--num-gpus={num_gpus}", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={self.dashboard.rsplit(':', 1)[1]}",
             f"--ray-client-server-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}",
             f"--temp-dir={self.dir / 'ray'}", "--disable-usage-stats"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def add_node(self, num_cpus: int, num_gpus: int = 0,
                 resources: dict[str, float] | None = None) -> Path:
        """Start another node joined to this head, as soon as the head's GCS listens (its
        dashboard and job agent come later: wait_ready); returns the node's log. Ray lists
        the node once its raylet registers."""
        host, port = self.address.rsplit(":", 1)
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the Ray head's GCS did not listen:\n"
                                       f"{(self.dir / 'head.log').read_text()}") from None
                time.sleep(0.3)
        n = len(self.nodes) + 1
        log = self.dir / f"node{n}.log"
        self.node_logs.append(log)
        with log.open("w") as out:
            self.nodes.append(subprocess.Popen(
                [RAY, "start", "--block", f"--address={self.address}",
                 "--node-ip-address=127.0.0.1", f"--num-cpus={num_cpus}",
                 f"--num-gpus={num_gpus}", f"--resources={json.dumps(resources or {})}",
                 f"--dashboard-agent-listen-port={free_port()}",
                 f"--temp-dir={self.dir / f'ray{n}'}", "--disable-usage-stats"],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
        return log

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        request = urllib.request.Request(f"{self.dashboard}/api/version", headers={
            "Authorization": f"Bearer {self.token_path.read_text()}"})
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with opener.open(request, timeout=2) as response:
                    if response.status == 200 and self.runs_a_job(deadline):
                        return
            except OSError:
                time.sleep(0.5)
        # read before stop(), which removes the head's directory and its log with it
        said = (self.dir / "head.log").read_text()
        self.stop()
        raise RuntimeError(f"the Ray head did not come up in {timeout_s:g} s:\n{said}")

    def runs_a_job(self, deadline: float) -> bool:
        """The dashboard answers before its job agent does: a job submitted in between
        is refused ("No available agent to submit job"), which a test would read as the
        control plane failing to submit. Ready means a trivial job ran to the end."""
        client = self.client()
        while time.monotonic() < deadline:
            try:
                sid = client.submit_job(entrypoint="true",
                                        submission_id=f"probe-{uuid.uuid4().hex[:8]}")
                break
            except RuntimeError:
                time.sleep(0.5)
        else:
            return False
        while time.monotonic() < deadline:
            status = client.get_job_status(sid)
            if status == JobStatus.SUCCEEDED:
                return True
            if status in (JobStatus.FAILED, JobStatus.STOPPED):
                log = client.get_job_logs(sid)
                self.stop()   # wait_ready's caller gets no head to stop
                raise RuntimeError(f"a trivial job on the Ray head ended {status}:\n"
                                   f"{log}")
            time.sleep(0.3)
        return False

    def client(self) -> JobSubmissionClient:
        return JobSubmissionClient(self.dashboard, headers={
            "Authorization": f"Bearer {self.token_path.read_text()}"})

    def stop(self) -> None:
        """SIGKILL every process of the head's session (SIGTERM makes Ray drain for 30 s).
        Job drivers run in sessions of their own; Ray's watcher kills each one within a
        second of its supervisor dying, and the jobs were stopped before this anyway."""
        sessions = {self.proc.pid, *(node.pid for node in self.nodes)}
        for _ in range(3):
            for pid in [int(p) for p in os.listdir("/proc") if p.isdigit()]:
                try:
                    if os.getsid(pid) in sessions:
                        os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.3)
        for process in [self.proc, *self.nodes]:
            process.wait(timeout=10)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
