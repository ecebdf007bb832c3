"""The data stream and its ledger (engine/orchestration/ledger.py), pure: positions in
order, each outcome counted, a checkpoint's state resumed without a gap or a repeat, and
the gap a skipped resume leaves."""

import json
import random

from engine import metrics as M
from engine.orchestration.ledger import (
    HASH,
    DataLedger,
    DataStream,
    resume_stream,
    running_hash,
)
from engine.tasks.base import Problem

from .conftest import checkpointed

SIZE, BLOCK = 5, 2


class EpochTask:
    """A dataset of SIZE rows, each epoch shuffled: position p is row order(p // SIZE)."""

    epoch_size = SIZE

    def order(self, epoch):
        rows = list(range(SIZE))
        random.Random(epoch).shuffle(rows)
        return rows

    def prompt_id(self, position):
        return self.order(position // SIZE)[position % SIZE]

    def train_problems(self, index, n, stream="rl"):
        return [Problem(f"row{self.prompt_id(p)}", "a") for p in range(index * n, index * n + n)]


def test_the_stream_serves_positions_in_order_and_the_ledger_counts_each_outcome():
    stream = DataStream(EpochTask(), BLOCK)
    problems = stream.draw(12)
    assert [p.position for p in problems] == list(range(12))
    epoch0 = {p.prompt for p in problems[:SIZE]}
    assert len(epoch0) == SIZE                      # an epoch serves every row once
    ledger = stream.ledger
    for p in problems[:8]:
        ledger.resolve(p.position)
    ledger.resolve(8, "filter")
    ledger.resolve(9, "stale")
    m = ledger.metrics()
    assert (m[M.DATA_SERVED], m[M.DATA_TRAINED], m[M.DATA_DROPPED], m[M.DATA_EPOCH]) == \
        (12, 8, 2, 2)
    assert m[M.DATA_DROPPED_BY.of(reason="filter")] == 1 and m[M.DATA_SKIPPED] == 0
    assert ledger.pending == {10, 11} and m[M.DATA_REPEATED] == 0
    ids = [EpochTask().prompt_id(p) for p in range(12)]
    assert ledger.digest == running_hash(ids) and HASH in ("xxh64", "blake2b64")
    assert running_hash(ids[::-1]) != ledger.digest       # the order counts


def test_a_resumed_stream_serves_the_pending_first_and_continues_without_gap_or_repeat(
        tmp_path):
    straight = DataStream(EpochTask(), BLOCK)
    straight.draw(14)

    first = DataStream(EpochTask(), BLOCK)
    for p in first.draw(9):
        if p.position < 6:
            first.ledger.resolve(p.position)   # 6, 7, 8 in flight at the checkpoint
    (tmp_path / "state.json").write_text(json.dumps({"step": 3}))
    checkpointed(tmp_path, first.ledger)
    logged = []
    resumed = resume_stream(EpochTask(), BLOCK, tmp_path, log=lambda m, **k: logged.append(m))
    assert "position 9 (epoch 1)" in logged[0] and "3 pending" in logged[0]
    again = resumed.draw(8)
    assert [p.position for p in again] == [6, 7, 8, 9, 10, 11, 12, 13]
    for p in again:
        resumed.ledger.resolve(p.position)
    ledger = resumed.ledger
    assert (ledger.served, ledger.trained, ledger.skipped, ledger.repeated) == (14, 14, 0, 0)
    assert ledger.digest == straight.ledger.digest and not ledger.pending
    # a second resume, from a checkpoint with nothing pending
    checkpointed(tmp_path, ledger)
    third = resume_stream(EpochTask(), BLOCK, tmp_path)
    assert [p.position for p in third.draw(2)] == [14, 15] and third.ledger.skipped == 0


def test_a_resume_that_skips_prompts_leaves_a_gap_the_ledger_counts(tmp_path):
    first = DataStream(EpochTask(), BLOCK)
    for p in first.draw(4):
        first.ledger.resolve(p.position)
    checkpointed(tmp_path, first.ledger)
    skipped = resume_stream(EpochTask(), BLOCK, tmp_path, skip=3)
    assert [p.position for p in skipped.draw(2)] == [7, 8]
    m = skipped.ledger.metrics()
    assert m[M.DATA_SKIPPED] == 3 and m[M.DATA_SERVED] == 6 and m[M.DATA_REPEATED] == 0


def test_serving_or_training_a_resolved_prompt_again_is_a_repeat():
    ledger = DataLedger(SIZE)
    ledger.serve(0, 0)
    ledger.resolve(0)
    ledger.resolve(0)                          # trained twice
    ledger.serve(0, 0)                         # served again behind the frontier
    assert ledger.repeated == 2 and ledger.served == 1 and ledger.trained == 2


def test_a_checkpoint_without_a_ledger_resumes_at_the_sync_position_and_says_so(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"step": 3}))
    logged = []
    stream = resume_stream(EpochTask(), BLOCK, tmp_path, log=lambda m, **k: logged.append(m))
    assert stream.draw(1)[0].position == 6 and stream.ledger.skipped == 0
    assert "holds no data.json" in logged[0]


def test_a_fork_onto_another_dataset_starts_its_data_anew(
        tmp_path):
    state = DataLedger(SIZE + 1, position=4, served=4).state()
    (tmp_path / "data.json").write_text(json.dumps(state))
    logged = []
    stream = resume_stream(EpochTask(), BLOCK, tmp_path, log=lambda m, **k: logged.append(m))
    assert stream.draw(1)[0].position == 0 and stream.ledger.served == 1
    assert "of 6 training rows, the run's task has 5" in logged[0]
    other = DataLedger.from_state({**state, "hash": "md5", "digest": "ff"})
    assert other.digest == 0 and other.served == 4        # the counts go on
