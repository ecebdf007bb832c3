"""The layering, enforced: jobs -> engine.api/engine.config -> engine internals.

The engine imports nothing of the web side, the web side reaches the engine only through
its two public modules, and those two stay free of torch/ray so the web process stays light.
"""

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

WEB_PACKAGES = {"django", "celery", "channels", "jobs", "controlplane"}
HEAVY_PACKAGES = ("torch", "ray", "transformers", "vllm")
ENGINE_SURFACE = {"engine.api", "engine.config"}


def python_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def imported_modules(path: Path) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """Yield (line, module, names) for every absolute import in a file.

    `import a.b` gives ("a.b", ()); `from a import b, c` gives ("a", ("b", "c")).
    Relative imports stay inside their own package and are skipped.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, tuple(alias.name for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None))
            in {"import_module", "__import__"}
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.lineno, node.args[0].value, ()


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


def test_the_engine_imports_nothing_from_the_web_side():
    files = python_files("engine")
    assert files, "no .py files under engine/: is the test looking in the right place?"
    offenders = [
        f"{where(path, line)} imports {module}"
        for path in files
        for line, module, _ in imported_modules(path)
        if module.split(".")[0] in WEB_PACKAGES
    ]
    rule = "engine/ must not import django, celery, channels, jobs or controlplane"
    assert not offenders, rule + ":\n" + "\n".join(offenders)


def test_engine_config_and_api_import_without_torch_or_ray():
    probe = (
        "import json, sys\n"
        "import engine.config, engine.api\n"
        f"heavy = {HEAVY_PACKAGES!r}\n"
        "print(json.dumps([m for m in heavy if m in sys.modules]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, f"importing engine.config/engine.api failed:\n{result.stderr}"
    loaded = json.loads(result.stdout.strip().splitlines()[-1])
    assert loaded == [], f"engine.config/engine.api pulled in {loaded} at import time"


def is_engine_surface(module: str, names: tuple[str, ...]) -> bool:
    if module in ENGINE_SURFACE:
        return True
    if module == "engine":
        # `from engine import api, config` is fine; `import engine` alone is not a surface.
        return bool(names) and all(f"engine.{name}" in ENGINE_SURFACE for name in names)
    return False


def test_the_web_side_reaches_the_engine_only_through_api_and_config():
    offenders = [
        f"{where(path, line)} imports {module}" + (f" ({', '.join(names)})" if names else "")
        for package in ("jobs", "controlplane")
        for path in python_files(package)
        for line, module, names in imported_modules(path)
        if module.split(".")[0] == "engine" and not is_engine_surface(module, names)
    ]
    rule = "jobs/ and controlplane/ may import only engine.api and engine.config"
    assert not offenders, rule + ":\n" + "\n".join(offenders)


# The engine's command lines are clients of the facade, as the control plane is.
ENGINE_ENTRY_POINTS = {"api.py", "cli.py", "ray_job.py", "__main__.py"}


def test_no_engine_module_imports_the_public_facade():
    """engine.api is the door into the engine; the engine's own modules import what they
    need from engine.events, engine.config and each other, never through it."""
    offenders = [
        f"{where(path, line)} imports {module}" + (f" ({', '.join(names)})" if names else "")
        for path in python_files("engine")
        if path.relative_to(ROOT / "engine").as_posix() not in ENGINE_ENTRY_POINTS
        for line, module, names in imported_modules(path)
        if module == "engine.api" or (module == "engine" and "api" in names)
    ]
    assert not offenders, "engine modules must not import engine.api:\n" + "\n".join(offenders)


# Of the engine the CLI may import only these: all are standard library and pydantic only.
CLIENT_ENGINE_MODULES = {"engine.config", "engine.metrics", "engine.events",
                         "engine.telemetry.http_sink"}


def test_the_cli_is_a_client_of_the_rest_api():
    """rlplane/ talks HTTP to /api/v1/: no Django, no control plane, and of the engine only
    engine.config (a TOML is validated locally before it is sent), engine.metrics (the
    metric names are the contract both ends of the API share), and for rlplane.track,
    which reports a run through the ingest door, the events that door takes
    (engine.events) and the engine's own sender of them (engine.telemetry.http_sink)."""
    files = python_files("rlplane")
    assert files, "no .py files under rlplane/"
    offenders = [
        f"{where(path, line)} imports {module}"
        for path in files
        for line, module, names in imported_modules(path)
        if module.split(".")[0] in WEB_PACKAGES | {"rest_framework", "drf_spectacular"}
        or (module.split(".")[0] == "engine" and module not in CLIENT_ENGINE_MODULES
            and not (module == "engine" and names
                     and {f"engine.{n}" for n in names} <= CLIENT_ENGINE_MODULES))
    ]
    assert not offenders, "rlplane/ must reach the control plane over HTTP:\n" + "\n".join(
        offenders)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def web_import_graph() -> dict[str, set[str]]:
    """Module -> the modules of jobs/ and controlplane/ it imports, late imports included
    (an import inside a function still ties the two modules together)."""
    files = {module_name(path): path for package in ("jobs", "controlplane")
             for path in python_files(package) if "migrations" not in path.parts}
    graph: dict[str, set[str]] = {name: set() for name in files}
    for name, path in files.items():
        for _, module, names in imported_modules(path):
            for target in (module, *(f"{module}.{n}" for n in names)):
                if target in files and target != name:
                    graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            component.append(node)
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_web_side_has_no_import_cycle():
    """A cycle hidden by a late import (queue <-> tasks, lifecycle <-> alert tasks) is
    still a cycle: cut it by moving what both sides need into a module of its own."""
    graph = web_import_graph()
    assert len(graph) > 40, "too few modules: is the graph reading jobs/ and controlplane/?"
    assert cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]   # the detector works
    assert not cycles(graph), f"import cycles: {cycles(graph)}"


def test_no_module_named_api_outside_the_rest_package():
    """Three "api" modules were one too many: the driver's door is jobs/ingest/, the
    users' is jobs/rest/, and the engine's facade keeps its name (engine.api)."""
    offenders = [str(path.relative_to(ROOT)) for path in python_files("jobs")
                 if path.name == "api.py" and path.parent != ROOT / "jobs" / "rest"]
    assert not offenders, f"rename these (what door are they?): {offenders}"


# A lower room never reaches up into a higher one.
MUST_NOT_IMPORT = {
    # (of alerts/ the models may read the pure rules of a threshold or a webhook target)
    "jobs.models": ("jobs.views", "jobs.charts", "jobs.queries", "jobs.rest", "jobs.consumers",
                    "jobs.runs", "jobs.ingest", "jobs.alerts.lifecycle", "jobs.alerts.tasks",
                    "jobs.alerts.delivery", "jobs.alerts.views"),
    "jobs.rest": ("jobs.views",),
    "jobs.queries": ("jobs.views", "jobs.rest", "jobs.runs", "jobs.ingest"),
    "jobs.charts": ("jobs.models", "jobs.views", "jobs.queries"),
}


def test_models_import_no_presentation_and_rooms_no_room_above_them():
    graph = web_import_graph()
    offenders = [f"{module} imports {target}"
                 for module, targets in sorted(graph.items())
                 for room, banned in MUST_NOT_IMPORT.items()
                 if module == room or module.startswith(room + ".")
                 for target in sorted(targets) if target.startswith(banned)]
    assert not offenders, "\n".join(offenders)


def test_every_module_with_celery_tasks_is_named_for_the_worker():
    """controlplane/celery.py names the task modules; one left out would leave its tasks
    unknown to the worker, and their messages dropped."""
    from controlplane.celery import TASK_MODULES

    defining = sorted(module_name(path) for path in python_files("jobs")
                      if "@shared_task" in path.read_text())
    assert defining, "no @shared_task found under jobs/"
    assert defining == sorted(TASK_MODULES)


# Where the metric names may be spelled out: the vocabulary itself (tests check the contract
# with literals of their own and are not scanned).
VOCABULARY = ROOT / "engine" / "metrics.py"
NAME_SCANNED = ("engine", "jobs", "controlplane", "rlplane")
BROWSER_SCANNED = {"static/js": "*.js", "templates": "*.html"}


def metric_literals(path: Path, names: set[str], families: list[re.Pattern]) -> Iterator[str]:
    """Each string literal of a Python file that spells a canonical metric name, and each
    f-string that spells one (``f"time/{phase}_s"``: a family member or a named metric)."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and node.value in names:
            yield f"{where(path, node.lineno)} {node.value!r}"
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(
                node.values[0], ast.Constant):
            parts = [v.value if isinstance(v, ast.Constant) else None for v in node.values]
            sample = "".join("x" if p is None else p for p in parts)     # f"time/{p}_s": time/x_s
            shape = re.compile("".join(".+" if p is None else re.escape(p) for p in parts))
            if any(f.fullmatch(sample) for f in families) or any(map(shape.fullmatch, names)):
                yield f"{where(path, node.lineno)} f-string {ast.unparse(node)}"


def test_no_metric_name_is_spelled_outside_the_vocabulary():
    """A renamed metric must break loudly: every module takes the names from engine/metrics.py
    (the web side through engine.api), the browser from the page data."""
    from engine import metrics

    names = set(metrics.METRICS)
    assert {"reward/mean", "bubble", "weight_sync/latency_s"} <= names
    families = [re.compile(re.sub(r"\\\{\w+\\\}", ".+", re.escape(f.template)))
                for f in metrics.FAMILIES]
    offenders = [hit for package in NAME_SCANNED for path in python_files(package)
                 if path != VOCABULARY and "migrations" not in path.parts
                 for hit in metric_literals(path, names, families)]
    quoted = re.compile(r"""(["'])([^"'\n]+)\1""")
    offenders += [f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1} "
                  f"{m.group(0)}"
                  for folder, pattern in BROWSER_SCANNED.items()
                  for path in sorted((ROOT / folder).rglob(pattern))
                  for text in [path.read_text()]
                  for m in quoted.finditer(text) if m.group(2) in names]
    assert not offenders, (f"{len(offenders)} metric names spelled outside engine/metrics.py "
                           "(import them from it; jobs/ through engine.api):\n"
                           + "\n".join(offenders))
