from engine.experience import ExperienceBuffer, Sample
from engine.tasks import Problem


def _group(version: int, n: int = 2) -> list[Sample]:
    return [Sample(Problem("1+1=", "2"), [1], [5, 2], [-0.1, -0.2], True, version, 0)
            for _ in range(n)]


def test_groups_leave_whole_and_in_order():
    buf = ExperienceBuffer()
    for v in range(3):
        buf.put(_group(v))
    taken = buf.take(2, learner_version=3)
    assert [g[0].version for g in taken] == [0, 1] and len(buf) == 1


def test_it_drops_groups_older_than_the_staleness_bound():
    buf = ExperienceBuffer(max_staleness=1)
    for v in (3, 4, 5):
        buf.put(_group(v))
    taken = buf.take(3, learner_version=5)
    assert [g[0].version for g in taken] == [4, 5]
    assert buf.dropped_stale == 1
