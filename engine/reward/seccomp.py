"""The sandbox's seccomp filter, compiled to classic BPF here (no libseccomp needed).

    bwrap --seccomp FD   reads the program below from FD and installs it, with
                         PR_SET_NO_NEW_PRIVS, just before it execs the interpreter:

    arch != this machine's       -> kill the process (no 32-bit / x32 side door)
    x32 syscall numbers          -> EPERM
    a denied syscall             -> EPERM   (namespaces, mounts, ptrace, kexec, bpf, keys, ...)
    clone3                       -> ENOSYS  (libc falls back to clone, whose flags we can read)
    clone with a CLONE_NEW* flag -> EPERM
    anything else                -> allowed

A denylist after flatpak's and Docker's default profiles: a program that computes things
needs none of these calls, and each one is a known path from a process to the kernel's or
another process's insides. bwrap's --disable-userns closes user namespaces a second way.
"""

from __future__ import annotations

import errno
import platform
import struct

_LD_ABS_W, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_KILL_PROCESS, _ALLOW, _ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16          # offsets in struct seccomp_data (args low word: LE)
X32_BIT = 0x40000000
CLONE_NEW_FLAGS = (0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
                   | 0x20000000 | 0x40000000)     # NEWNS CGROUP UTS IPC USER PID NET

_ARCHES = {"x86_64": (0xC000003E, 0), "aarch64": (0xC00000B7, 1)}   # AUDIT_ARCH, column
# name: (x86_64 nr, aarch64 nr), from the kernel's syscall tables; all but clone and
# clone3 are denied outright
_NUMBERS = {
    "clone": (56, 220), "clone3": (435, 435), "ptrace": (101, 117),
    "process_vm_readv": (310, 270), "process_vm_writev": (311, 271), "kcmp": (312, 272),
    "pidfd_getfd": (438, 438), "mount": (165, 40), "umount2": (166, 39),
    "pivot_root": (155, 41), "chroot": (161, 51), "unshare": (272, 97), "setns": (308, 268),
    "mount_setattr": (442, 442), "open_tree": (428, 428), "move_mount": (429, 429),
    "fsopen": (430, 430), "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433),
    "kexec_load": (246, 104), "kexec_file_load": (320, 294), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "keyctl": (250, 219),
    "add_key": (248, 217), "request_key": (249, 218), "init_module": (175, 105),
    "finit_module": (313, 273), "delete_module": (176, 106), "swapon": (167, 224),
    "swapoff": (168, 225), "reboot": (169, 142), "acct": (163, 89), "settimeofday": (164, 170),
    "adjtimex": (159, 171), "clock_settime": (227, 112), "clock_adjtime": (305, 266),
    "open_by_handle_at": (304, 265), "name_to_handle_at": (303, 264), "syslog": (103, 116),
    "quotactl": (179, 60), "vhangup": (153, 58), "lookup_dcookie": (212, 18),
    "personality": (135, 92), "io_uring_setup": (425, 425), "io_uring_enter": (426, 426),
    "io_uring_register": (427, 427),
}


def syscall_numbers(machine: str | None = None) -> dict[str, int]:
    return _table(machine)[1]


def _table(machine: str | None) -> tuple[int, dict[str, int]]:
    machine = machine or platform.machine()
    if machine not in _ARCHES:
        raise RuntimeError(f"the sandbox's seccomp filter knows x86_64 and aarch64, not "
                           f"{machine}; add this machine's syscall numbers to "
                           "engine/reward/seccomp.py")
    arch, column = _ARCHES[machine]
    return arch, {name: nrs[column] for name, nrs in _NUMBERS.items()}


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes:
    """The filter as bwrap --seccomp wants it: an array of struct sock_filter."""
    arch, nr = _table(machine)
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    prog = [_op(_LD_ABS_W, _ARCH), _op(_JEQ, arch, jt=1), _op(_RET, _KILL_PROCESS),
            _op(_LD_ABS_W, _NR)]
    if arch == _ARCHES["x86_64"][0]:
        prog += [_op(_JGE, X32_BIT, jf=1), _op(_RET, eperm)]
    for name in (n for n in nr if n not in ("clone", "clone3")):
        prog += [_op(_JEQ, nr[name], jf=1), _op(_RET, eperm)]
    prog += [_op(_JEQ, nr["clone3"], jf=1), _op(_RET, enosys),
             _op(_JEQ, nr["clone"], jf=3), _op(_LD_ABS_W, _ARG0),
             _op(_JSET, CLONE_NEW_FLAGS, jf=1), _op(_RET, eperm),
             _op(_RET, _ALLOW)]
    return b"".join(prog)
