"""The layering in DESIGN.md, enforced: jobs -> engine.api/engine.config -> engine internals.

The engine imports nothing of the web side, the web side reaches the engine only through
its two public modules, and those two stay free of torch/ray so the web process stays light.
"""

import ast
import json
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


def test_the_cli_is_a_client_of_the_rest_api():
    """rlplane/ talks HTTP to /api/v1/: no Django, no control plane, and of the engine only
    engine.config (a TOML is validated locally before it is sent)."""
    files = python_files("rlplane")
    assert files, "no .py files under rlplane/"
    offenders = [
        f"{where(path, line)} imports {module}"
        for path in files
        for line, module, names in imported_modules(path)
        if module.split(".")[0] in WEB_PACKAGES | {"rest_framework", "drf_spectacular"}
        or (module.split(".")[0] == "engine" and module != "engine.config")
    ]
    assert not offenders, "rlplane/ must reach the control plane over HTTP:\n" + "\n".join(
        offenders)
