"""The generated SECRET_KEY: one key however many processes start at once, never empty
(issue 19 item 9: with O_EXCL alone, 115 of 300 racing starts read an empty file)."""

import multiprocessing as mp

from controlplane.secret import load_or_create_secret_key


def read_key(args):
    path, barrier = args
    barrier.wait()
    return load_or_create_secret_key(path)


def test_racing_starts_all_read_the_same_nonempty_key(tmp_path, monkeypatch):
    monkeypatch.delenv("RLPLANE_SECRET_KEY", raising=False)
    ctx = mp.get_context("fork")
    for trial in range(10):
        path = tmp_path / f"trial{trial}" / "secret_key"
        with ctx.Manager() as manager:
            barrier = manager.Barrier(8)
            with ctx.Pool(8) as pool:
                keys = pool.map(read_key, [(path, barrier)] * 8)
        assert len(set(keys)) == 1 and len(keys[0]) >= 50
        assert path.stat().st_mode & 0o777 == 0o600
        assert [p.name for p in path.parent.iterdir()] == ["secret_key"]   # no temp left
