"""SECRET_KEY from RLPLANE_SECRET_KEY, else one generated once per checkout.

The generated key lives in .rlplane/secret_key (git-ignored), so sessions survive
restarts without anyone having to invent a key for a local install.
"""

import os
from pathlib import Path

from django.core.management.utils import get_random_secret_key


def load_or_create_secret_key(path: Path) -> str:
    from_env = os.environ.get("RLPLANE_SECRET_KEY")
    if from_env:
        return from_env
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: when two processes start at once, one writes and both read the same key.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text().strip()
    with os.fdopen(fd, "w") as f:
        f.write(get_random_secret_key())
    return path.read_text().strip()
