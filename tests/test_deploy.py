"""deploy/ (issue 35 item 4) kept true to the code: the systemd units run the embedded
stack's commands, the env template names every variable the settings read, and a bad
RLPLANE_DRIVER_RESOURCES is refused naming the variable."""

import asyncio
import re
import shlex
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from controlplane.settings import parse_resources
from controlplane.stack import service_argv

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
UNITS = {"web": "rlplane-web.service", "celery-worker": "rlplane-celery-worker.service",
         "celery-beat": "rlplane-celery-beat.service"}
# Where the settings and what they hand to drivers read the environment.
READERS = ["controlplane/settings.py", "controlplane/secret.py", "jobs/cluster/ray.py",
           "jobs/runs/submit.py"]
READ = re.compile(r'(?:environ\.get|environ\[|env_flag|env_list)\(?\s*"([A-Z][A-Z0-9_]+)"'
                  r'|"([A-Z][A-Z0-9_]+)" in os\.environ')


def exec_start(unit: str) -> list[list[str]]:
    """The unit's ExecStart command lines, split as systemd does, %% unescaped."""
    lines = (DEPLOY / "systemd" / unit).read_text().splitlines()
    return [shlex.split(line.split("=", 1)[1].replace("%%", "%"))
            for line in lines if line.startswith("ExecStart=")]


def test_the_systemd_units_run_the_embedded_stacks_commands():
    expected = service_argv("/opt/rlplane/.venv/bin/python", "${RLPLANE_HOST}",
                            "${RLPLANE_PORT}", "/var/lib/rlplane/celerybeat-schedule")
    for name, unit in UNITS.items():
        assert exec_start(unit) == [expected[name]], unit
    setup = exec_start("rlplane-setup.service")
    assert [argv[2:] for argv in setup] == [["migrate", "--noinput"], ["reconcile_runs"]]
    target = (DEPLOY / "systemd" / "rlplane.target").read_text()
    assert all(unit in target for unit in [*UNITS.values(), "rlplane-setup.service"])


def test_the_websocket_unit_is_the_web_command_on_its_port_weighted_above_the_others():
    web = service_argv("/opt/rlplane/.venv/bin/python", "${RLPLANE_HOST}",
                       "${RLPLANE_WS_PORT}", "schedule")["web"]
    assert exec_start("rlplane-ws.service") == [web]
    units = {unit.name: unit.read_text() for unit in (DEPLOY / "systemd").glob("*.service")}
    assert re.findall(r"^CPUWeight=(\d+)$", units.pop("rlplane-ws.service"), re.M) == ["1000"]
    assert not any("CPUWeight" in text for text in units.values())   # systemd's 100


def test_the_web_process_sends_websocket_messages_uncompressed():
    # Compression is per socket: a run's watchers each deflated the same message.
    web = service_argv("python", "127.0.0.1", "8000", "schedule")["web"]
    assert web[-2:] == ["--ws-per-message-deflate", "false"]


def test_the_env_template_names_every_variable_the_settings_read():
    read = {a or b for path in READERS
            for a, b in READ.findall((ROOT / path).read_text())} - {"DJANGO_SETTINGS_MODULE"}
    assert {"DATABASE_URL", "REDIS_URL", "RAY_ADDRESS", "RLPLANE_RUNS_DIR",
            "RLPLANE_SECRET_KEY", "RAY_AUTH_TOKEN"} <= read       # the pattern finds them
    template = (DEPLOY / "rlplane.env.example").read_text()
    named = set(re.findall(r"^#?([A-Z][A-Z0-9_]+)=", template, re.MULTILINE))
    assert read - named == set()
    # and what the units' command lines use
    assert {"RLPLANE_HOST", "RLPLANE_PORT", "RLPLANE_WS_PORT"} <= named


def test_driver_resources_are_name_amount_pairs_of_custom_resources():
    assert parse_resources([]) == {}
    assert parse_resources(["rlplane_driver=1", "big_mem=0.5"]) == {"rlplane_driver": 1.0,
                                                                   "big_mem": 0.5}


@pytest.mark.parametrize("item", ["GPU=1", "CPU=2", "rlplane_driver", "x=0", "x=many", "=1"])
def test_a_bad_driver_resource_is_refused_naming_the_variable(item):
    with pytest.raises(ImproperlyConfigured, match="RLPLANE_DRIVER_RESOURCES"):
        parse_resources([item])


def test_control_planes_on_one_redis_in_two_databases_hear_only_their_own_broadcasts():
    """Pub/sub channels belong to the whole Redis server, not to a numbered database."""
    from asgiref.sync import async_to_sync
    from channels_redis.pubsub import RedisPubSubChannelLayer

    from controlplane.settings import channel_prefix

    base = settings.REDIS_URL.rsplit("/", 1)[0]
    assert channel_prefix("unix:///run/redis.sock?db=2") == "rlplane.db2."

    async def scenario():
        layers = [RedisPubSubChannelLayer(hosts=[url], prefix=channel_prefix(url))
                  for url in (f"{base}/14", f"{base}/15", f"{base}/14")]
        try:
            listeners = [await layer.new_channel() for layer in layers[1:]]
            for layer, channel in zip(layers[1:], listeners, strict=True):
                await layer.group_add("run.1", channel)
            await layers[0].group_send("run.1", {"type": "run.events", "events": []})
            heard = await layers[2].receive(listeners[1])           # the same database's
            try:
                other = await asyncio.wait_for(layers[1].receive(listeners[0]), 1.0)
            except TimeoutError:
                other = None
        finally:
            for layer in layers:
                await layer.flush()
        return heard, other

    heard, other = async_to_sync(scenario)()
    assert heard["type"] == "run.events" and other is None
