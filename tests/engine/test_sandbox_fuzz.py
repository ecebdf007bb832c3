"""Fuzzing the sandbox reward with random Python snippets: the reward worker's judge always
returns a verdict with a known reason, never runs past the timeout (plus kill time), and
leaves no process behind."""

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.config import CodeTaskConfig, SandboxRewardConfig
from engine.reward.service import SANDBOX_REASONS, RewardWorker
from engine.tasks import CodeTask, Problem

from .test_sandbox import stray_processes

TIMEOUT_S = 1.0
KILL_GRACE_S = 10.0      # spawn + SIGKILL + reaping on a loaded 2-core box
WORKER = RewardWorker(SandboxRewardConfig(timeout_s=TIMEOUT_S, cpu_s=1), CodeTask(CodeTaskConfig()))
PROBLEM = Problem("add3=", "f=lambda x:x+3")

STATEMENTS = [
    "f=lambda x:x+3", "def f(x):\n    return x*2", "f=None", "f=lambda x:1/0",
    "import os", "import sys", "import ctypes", "x=[0]*10**9", "print('y'*10**6)",
    "while True:\n    pass", "for _ in range(10**9):\n    pass", "raise SystemExit(3)",
    "import os\nos._exit(9)", "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)",
    "import sys\nsys.stdout.close()", "import os\nos.close(1)\nos.close(2)",
    "import os\nif os.fork() == 0:\n    while True:\n        pass",
    "import sys\nsys.setrecursionlimit(100)\ndef g(n):\n    return g(n+1)\ng(0)",
    "open('x', 'w').write('a' * 10**7)", "import time\ntime.sleep(5)", "f=lambda x:'3'",
    "f=lambda x:x+True", "f=lambda x:float('nan')", "f=lambda x:10**10**5",
    "f=lambda x:[x]", "def f(x):\n    yield x", "class f:\n    pass", "f=print",
]
snippet = st.one_of(
    st.lists(st.sampled_from(STATEMENTS), min_size=1, max_size=4).map("\n".join),
    st.text(max_size=80),
    st.text(alphabet="fx=lambd:+-*0123456789() \n", max_size=40),
)


@settings(max_examples=100, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(code=snippet, finished=st.booleans())
def test_random_snippets_never_crash_the_worker_nor_hang_past_the_timeout(code, finished):
    t0 = time.monotonic()
    verdict, start, end = WORKER.score(PROBLEM, code, finished)
    assert time.monotonic() - t0 <= TIMEOUT_S + KILL_GRACE_S
    assert verdict.reason in set(SANDBOX_REASONS) | {"unfinished"}
    assert verdict.reward in (1.0, 0.0, -0.1)
    assert start <= end
    assert stray_processes() == []
