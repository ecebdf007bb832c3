"""The cluster page: nodes, resources, which runs hold what, utilization; page and htmx
fragment. Ray is faked at jobs.cluster.status.fetch_json for the shapes, and real (the
session's local head, with two logical GPUs) for one test."""

import re
import time

import pytest

from controlplane import processes as proc
from controlplane.processes import ChildRecord, StackRecord
from jobs.cluster import status as cluster
from jobs.cluster.ray import submission_id

from .test_tasks import free_port

HTMX = {"HX-Request": "true"}
NODE_ID = "ab12cd34ef56" + "0" * 44


@pytest.fixture
def viewer(client, django_user_model):
    client.force_login(django_user_model.objects.create_user("viewer"))
    return client


def ray_answers(run_id: int, gpus=()) -> dict:
    """What a one-node cluster's dashboard answers, trimmed to the fields the page reads."""
    job = {"type": "SUBMISSION", "job_id": "02000000", "submission_id": f"rlplane-run-{run_id}",
           "status": "RUNNING", "driver_node_id": NODE_ID, "driver_info": {"pid": 999999999},
           "entrypoint_num_cpus": 1}
    return {
        "/nodes?view=summary": {"data": {"summary": [{
            "hostname": "gpu-box", "ip": "10.0.0.5", "cpu": 42.0, "mem": [16e9, 8e9, 50.0, 8e9],
            "gpus": list(gpus),
            "raylet": {"nodeId": NODE_ID, "isHeadNode": True, "state": "ALIVE",
                       "resourcesTotal": {"CPU": 8.0, "GPU": 2.0, "node:10.0.0.5": 1.0}}}]}},
        "/api/cluster_status": {"data": {"clusterStatus": {"loadMetricsReport": {
            "usageByNode": {NODE_ID: {"CPU": [3.0, 8.0], "GPU": [1.0, 2.0]}}}}}},
        "/api/jobs/": [job, {"submission_id": "someone-else", "status": "RUNNING"}],
        "/api/v0/actors?detail=1&limit=10000": {"data": {"result": {"result": [
            {"state": "ALIVE", "job_id": "02000000", "placement_group_id": None,
             "required_resources": {"GPU": 1.0, "CPU": 1.0}, "class_name": "LearnerWorker",
             "pid": 4242, "node_id": NODE_ID},
            {"state": "ALIVE", "job_id": "01000000", "name":
             f"_ray_internal_job_actor_rlplane-run-{run_id}", "class_name": "JobSupervisor",
             "pid": 4100, "node_id": NODE_ID, "required_resources": {}}]}}},
        f"/nodes/{NODE_ID}": {"data": {"detail": {"workers": [
            {"pid": 4242, "cpuPercent": 93.0, "memoryInfo": {"rss": 512 * 2**20}},
            {"pid": 4100, "cpuPercent": 0.5, "memoryInfo": {"rss": 64 * 2**20}}]}}},
        "/api/v0/placement_groups?detail=1&limit=10000": {"data": {"result": {"result": []}}},
    }


@pytest.fixture
def fake_ray(monkeypatch, make_run):
    run = make_run(name="on-ray")
    answers = ray_answers(run.pk)
    monkeypatch.setattr(cluster, "fetch_json", lambda path: answers[path])
    return run, answers


def test_an_anonymous_visitor_is_sent_to_the_login_page(client, db):
    response = client.get("/cluster")

    assert response.status_code == 302 and response["Location"] == "/login?next=/cluster"


def test_the_page_shows_nodes_their_resources_and_the_runs_that_hold_them(viewer, fake_ray):
    run, _ = fake_ray

    response = viewer.get("/cluster")

    html = response.content.decode()
    assert response.status_code == 200 and "<html" in html
    assert "gpu-box" in html and "10.0.0.5" in html
    assert "GPU (logical, num_gpus): 1 / 2" in html and "CPU: 3 / 8" in html
    assert f'href="/runs/{run.pk}"' in html and f"rlplane-run-{run.pk}" in html
    # The run's holdings: its entrypoint's CPU plus its actor's CPU and GPU.
    assert "CPU: 2, GPU: 1" in html
    assert "1 other live Ray job" in html
    assert 'href="/cluster"' in html  # the nav links here


def test_the_htmx_fragment_is_the_live_part_only(viewer, fake_ray):
    response = viewer.get("/cluster", headers=HTMX)

    html = response.content.decode()
    assert response.status_code == 200
    assert "<html" not in html
    assert 'id="cluster"' in html and 'hx-trigger="every 3s"' in html and "gpu-box" in html


def test_the_embedded_stacks_processes_and_their_restarts_are_listed(
        viewer, fake_ray, monkeypatch, tmp_path):
    note = {"child": "redis", "pid": 41, "exit": "killed by signal 9",
            "died_at": "2026-12-03T05:00:00+00:00", "delay_s": 1.0, "in_window": 1,
            "budget": 5, "window_s": 600.0, "new_pid": 42,
            "restarted_at": "2026-12-03T05:00:01+00:00"}
    proc.write_pid_file(tmp_path / "stack.json", StackRecord(
        supervisor_pid=1, supervisor_create_time=0.0, state_dir=str(tmp_path),
        children=[ChildRecord(name="redis", pid=42, create_time=0.0)], restarts=[note]))
    monkeypatch.setenv(proc.STACK_MARKER, str(tmp_path))

    html = viewer.get("/cluster", headers=HTMX).content.decode()

    assert 'id="stack-child-redis"' in html
    assert "<strong>redis</strong> (pid 41) killed by signal 9 at 2026-12-03T05:00:00" in html
    assert "restarted after 1.0 s as pid 42 (1 of 5 restarts allowed within 600 s)" in html


def test_outside_the_embedded_stack_there_is_no_stack_panel(viewer, fake_ray, monkeypatch):
    monkeypatch.delenv(proc.STACK_MARKER, raising=False)

    assert 'id="stack-processes"' not in viewer.get("/cluster", headers=HTMX).content.decode()


def test_without_gpus_utilization_is_cpu_per_core_clearly_labelled(viewer, fake_ray):
    html = viewer.get("/cluster", headers=HTMX).content.decode()

    assert "This host: CPU (no GPUs visible to NVML)" in html and "cpu0:" in html


def test_a_live_runs_actors_are_listed_with_the_cpu_and_memory_their_node_measured(
        viewer, fake_ray):
    run, _ = fake_ray

    html = viewer.get("/cluster", headers=HTMX).content.decode()

    row = next(r for r in html.split('<tr class="run-process">')[1:] if "LearnerWorker" in r)
    assert f"run #{run.pk}" in row and "4242" in row and "gpu-box" in row
    assert "93 %" in row and "512 MiB" in row
    # Its entrypoint runs on another host than the control plane: said, not guessed.
    assert "entrypoint (on another host: not measured here)" in html


def test_physical_gpus_that_ray_reports_are_listed_per_node(viewer, monkeypatch, make_run):
    answers = ray_answers(make_run().pk, gpus=[{
        "index": 0, "name": "NVIDIA H200", "utilizationGpu": 87, "memoryUsed": 1024,
        "memoryTotal": 143771}])
    monkeypatch.setattr(cluster, "fetch_json", lambda path: answers[path])

    html = viewer.get("/cluster").content.decode()

    assert "#0 NVIDIA H200: 87 %, 1024 / 143771 MiB" in html


def test_an_unreachable_ray_is_said_plainly_instead_of_an_error(viewer, settings):
    settings.RAY_DASHBOARD_ADDRESS = f"http://127.0.0.1:{free_port()}"  # nothing listens

    page = viewer.get("/cluster")
    fragment = viewer.get("/cluster", headers=HTMX)

    for response in (page, fragment):
        html = response.content.decode()
        assert response.status_code == 200
        assert "Ray is unreachable" in html and settings.RAY_DASHBOARD_ADDRESS in html
        assert "This host: CPU" in html  # this host's utilization still shows


@pytest.mark.slow
def test_a_real_ray_head_shows_its_logical_gpus_and_a_runs_job(
        viewer, shared_ray_head, settings, monkeypatch, make_run):
    # The session's head declares two logical GPUs on this GPU-less host (tests/shared.py).
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    settings.RAY_DASHBOARD_ADDRESS = shared_ray_head.dashboard
    settings.RAY_AUTH_TOKEN_PATH = str(shared_ray_head.token_path)
    run = make_run(name="real-ray")
    client = shared_ray_head.client()
    # A busy entrypoint, bounded by its own clock: the page must show its CPU, not 0.
    busy = 'python -c "import time; t = time.time()\nwhile time.time() - t < 120: pass"'
    sid = client.submit_job(entrypoint=busy, submission_id=submission_id(run.pk))
    try:
        deadline = time.monotonic() + 60
        while client.get_job_status(sid) != "RUNNING" and time.monotonic() < deadline:
            time.sleep(0.5)
        html = ""
        while time.monotonic() < deadline:  # the node registers a moment after the API
            html = viewer.get("/cluster").content.decode()
            # Ray's first sample of a new process can read 0 % CPU: wait for a measured one
            if "GPU (logical, num_gpus)" in html and max(entrypoint_cpu(html), default=0) > 0:
                break
            time.sleep(0.5)
    finally:
        client.stop_job(sid)

    assert "Ray is unreachable" not in html
    assert "GPU (logical, num_gpus): 0 / 2" in html and "CPU: 0 / 2" in html
    assert "head" in html and f'href="/runs/{run.pk}"' in html and sid in html
    cpu = entrypoint_cpu(html)
    assert cpu and max(cpu) > 0, html        # the busy entrypoint, measured


def entrypoint_cpu(html: str) -> list[float]:
    """The CPU % the page shows for the job's entrypoint process (measured rows only)."""
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row)
            for row in re.findall(r'<tr class="run-process">(.*?)</tr>', html, re.S)]
    return [float(cells[4].removesuffix(" %")) for cells in rows
            if cells[1].startswith("entrypoint") and cells[4] != "–"]


def test_each_threads_first_cpu_reading_samples_a_window_not_nothing(monkeypatch):
    # psutil remembers the previous per-core sample per thread; the web server renders
    # on a pool of threads, and a fresh one's first non-blocking call reads 0 %.
    import threading

    from jobs.cluster import processes

    intervals = []
    monkeypatch.setattr(processes.psutil, "cpu_percent",
                        lambda interval, percpu: intervals.append(interval) or [50.0])
    monkeypatch.setattr(processes, "_cores_primed", set())
    processes.cpu_per_core()
    processes.cpu_per_core()
    other = threading.Thread(target=processes.cpu_per_core)
    other.start()
    other.join()

    assert intervals == [processes.SAMPLE_S, None, processes.SAMPLE_S]
