"""A client-only install (`pip install rlplane`, issue 29): the CLI, rlplane.track,
watch-files and the adapters, without the control plane's or the engine's weight.

What an install pulls is the closure of the package's requirements without extras,
walked here over the installed distributions' own metadata (what pip would resolve them
to, offline). Importing the client must not reach further than that closure either."""

import subprocess
import sys
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

HEAVY = {"torch", "django", "ray", "celery", "transformers", "channels", "numpy", "vllm"}


def closure(dist: str) -> set[str]:
    """Every distribution ``dist`` pulls without extras on this Python, itself included."""
    seen, todo = set(), [canonicalize_name(dist)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for text in metadata.requires(name) or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonicalize_name(req.name))
    return seen


def test_a_client_only_install_pulls_no_torch_django_or_ray():
    pulled = closure("rlplane")

    assert not pulled & HEAVY, sorted(pulled & HEAVY)
    assert {"pydantic", "rich"} <= pulled


@pytest.mark.parametrize("module", ["rlplane.cli", "rlplane.track", "rlplane.tail"])
def test_the_client_imports_only_what_a_client_install_has(module):
    code = (f"import sys, {module}; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()

    assert not set(out) & HEAVY, sorted(set(out) & HEAVY)
