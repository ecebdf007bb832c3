"""The generated SECRET_KEY: one key however many starts race, never empty (issue 19 item
9: with O_EXCL alone, 115 of 300 racing starts read an empty file). The race is in the
filesystem (create, write, read), so threads released together exercise it as processes
do, without forking a test process that holds other threads."""

import threading

from controlplane.secret import load_or_create_secret_key


def test_racing_starts_all_read_the_same_nonempty_key(tmp_path, monkeypatch):
    monkeypatch.delenv("RLPLANE_SECRET_KEY", raising=False)
    for trial in range(30):
        path = tmp_path / f"trial{trial}" / "secret_key"
        start, keys = threading.Barrier(8), []

        def start_up(path=path, start=start, keys=keys):
            start.wait()
            keys.append(load_or_create_secret_key(path))

        threads = [threading.Thread(target=start_up) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(keys) == 8 and len(set(keys)) == 1 and len(keys[0]) >= 50, keys
        assert path.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in path.parent.iterdir()] == ["secret_key"]   # no temp left
