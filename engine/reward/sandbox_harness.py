"""Stage 2 of the sandbox: runs inside the limits, as an unprivileged user, stdlib only.

    python -I -S -c <this file>  < the job, marshalled (stdin: argv would cap a program at
                                   128 KiB; sandbox.job_bytes)
      set rlimits (cpu, address space, file size, processes, open files)
      -> fd 1 kept for the report, user prints go to fd 2 -> exec the program
      -> call f on each test input -> one JSON line: {"outputs": [...], "errors": [...]}

The harness only reports what f returned (or which error it raised); the parent judges
the outputs against the expected values. The program runs in this process and can write
anything to the report's fd, so the parent parses the report as untrusted data
(sandbox.parse_report): a forged report gains nothing the program could not have computed,
and a malformed one is a crash verdict.

Nothing here imports json: its import (re, enum, functools, collections) cost 10 ms of CPU,
about as much as the interpreter's own start and a quarter of a whole sandboxed run's
(bench/sandbox_overhead.py). The job comes marshalled (a builtin module; the parent wrote
it, before any program runs), and the report is written with the C escaper json itself
uses for strings (_json), in the few shapes it has.
"""

import marshal
import os
import resource
import sys
from _json import encode_basestring_ascii as quote

job = marshal.loads(sys.stdin.buffer.read())
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
MAIN = os.getpid()
MB = 2**20

for name, soft in (("RLIMIT_CPU", job["cpu_s"]), ("RLIMIT_AS", job["memory_mb"] * MB),
                   ("RLIMIT_FSIZE", job["file_size_kb"] * 1024),
                   ("RLIMIT_NPROC", job["max_processes"]),
                   ("RLIMIT_NOFILE", job["open_files"]), ("RLIMIT_CORE", 0)):
    limit = getattr(resource, name)
    hard = soft + 1 if name == "RLIMIT_CPU" else soft   # SIGXCPU first, SIGKILL a second later
    resource.setrlimit(limit, (soft, hard))

report = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)


def error_kind(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return "limit:memory"
    if isinstance(exc, OSError) and exc.errno == 27:          # EFBIG: RLIMIT_FSIZE
        return "limit:file_size"
    if isinstance(exc, OSError) and exc.errno == 24:          # EMFILE: RLIMIT_NOFILE
        return "limit:open_files"
    if isinstance(exc, OSError) and exc.errno == 28:          # ENOSPC: the private tmpfs
        return "limit:disk"
    if isinstance(exc, BlockingIOError) and exc.errno == 11:  # EAGAIN from fork: RLIMIT_NPROC
        return "limit:processes"
    return f"error:{type(exc).__name__}"[:64]


def encode(value) -> str:
    """JSON of the report's values: None, a str, an int (not a bool), a list of them."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, int):
        return int.__repr__(value)       # as json.dumps does: never a subclass's repr
    return "[" + ",".join(map(encode, value)) + "]"


def finish(payload: dict) -> None:
    if os.getpid() != MAIN:          # a forked copy of the program never reports
        os._exit(0)
    report.write("{" + ",".join(f"{quote(k)}:{encode(v)}" for k, v in payload.items())
                 + "}\n")
    report.flush()
    os._exit(0)


scope: dict = {"__name__": "__sandbox__"}
try:
    exec(compile(job["code"], "<completion>", "exec"), scope)
    f = scope["f"]
except BaseException as exc:  # noqa: BLE001 - whatever the program raises is its result
    finish({"load_error": error_kind(exc)})

outputs, errors = [], []
for x in job["inputs"]:
    try:
        y = f(x)
        outputs.append(y if isinstance(y, int) and not isinstance(y, bool)
                       and abs(y) < 2**53 else repr(y)[:64])
        errors.append(None)
    except BaseException as exc:  # noqa: BLE001
        outputs.append(None)
        errors.append(error_kind(exc))
finish({"outputs": outputs, "errors": errors})
