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

_DENIED_NAMES = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd",
    "mount", "umount2", "pivot_root", "chroot", "unshare", "setns", "mount_setattr",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick",
    "kexec_load", "kexec_file_load", "bpf", "perf_event_open", "userfaultfd",
    "keyctl", "add_key", "request_key", "init_module", "finit_module", "delete_module",
    "swapon", "swapoff", "reboot", "acct", "settimeofday", "adjtimex", "clock_settime",
    "clock_adjtime", "open_by_handle_at", "name_to_handle_at", "syslog", "quotactl",
    "vhangup", "lookup_dcookie", "personality", "io_uring_setup", "io_uring_enter",
    "io_uring_register",
)
# (AUDIT_ARCH, {name: nr}) per machine; the numbers are the kernel's syscall tables.
_TABLES = {
    "x86_64": (0xC000003E, {
        "clone": 56, "clone3": 435, "ptrace": 101, "process_vm_readv": 310,
        "process_vm_writev": 311, "kcmp": 312, "pidfd_getfd": 438, "mount": 165,
        "umount2": 166, "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308,
        "mount_setattr": 442, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "kexec_load": 246,
        "kexec_file_load": 320, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
        "keyctl": 250, "add_key": 248, "request_key": 249, "init_module": 175,
        "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168,
        "reboot": 169, "acct": 163, "settimeofday": 164, "adjtimex": 159,
        "clock_settime": 227, "clock_adjtime": 305, "open_by_handle_at": 304,
        "name_to_handle_at": 303, "syslog": 103, "quotactl": 179, "vhangup": 153,
        "lookup_dcookie": 212, "personality": 135, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427}),
    "aarch64": (0xC00000B7, {
        "clone": 220, "clone3": 435, "ptrace": 117, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "pidfd_getfd": 438, "mount": 40,
        "umount2": 39, "pivot_root": 41, "chroot": 51, "unshare": 97, "setns": 268,
        "mount_setattr": 442, "open_tree": 428, "move_mount": 429, "fsopen": 430,
        "fsconfig": 431, "fsmount": 432, "fspick": 433, "kexec_load": 104,
        "kexec_file_load": 294, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
        "keyctl": 219, "add_key": 217, "request_key": 218, "init_module": 105,
        "finit_module": 273, "delete_module": 106, "swapon": 224, "swapoff": 225,
        "reboot": 142, "acct": 89, "settimeofday": 170, "adjtimex": 171,
        "clock_settime": 112, "clock_adjtime": 266, "open_by_handle_at": 265,
        "name_to_handle_at": 264, "syslog": 116, "quotactl": 60, "vhangup": 58,
        "lookup_dcookie": 18, "personality": 92, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427}),
}


def syscall_numbers(machine: str | None = None) -> dict[str, int]:
    return _table(machine)[1]


def _table(machine: str | None) -> tuple[int, dict[str, int]]:
    machine = machine or platform.machine()
    if machine not in _TABLES:
        raise RuntimeError(f"the sandbox's seccomp filter knows x86_64 and aarch64, not "
                           f"{machine}; add this machine's syscall numbers to "
                           "engine/reward/seccomp.py")
    return _TABLES[machine]


def _op(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def filter_program(machine: str | None = None) -> bytes:
    """The filter as bwrap --seccomp wants it: an array of struct sock_filter."""
    arch, nr = _table(machine)
    eperm, enosys = _ERRNO | errno.EPERM, _ERRNO | errno.ENOSYS
    prog = [_op(_LD_ABS_W, _ARCH), _op(_JEQ, arch, jt=1), _op(_RET, _KILL_PROCESS),
            _op(_LD_ABS_W, _NR)]
    if arch == _TABLES["x86_64"][0]:
        prog += [_op(_JGE, X32_BIT, jf=1), _op(_RET, eperm)]
    for name in _DENIED_NAMES:
        prog += [_op(_JEQ, nr[name], jf=1), _op(_RET, eperm)]
    prog += [_op(_JEQ, nr["clone3"], jf=1), _op(_RET, enosys),
             _op(_JEQ, nr["clone"], jf=3), _op(_LD_ABS_W, _ARG0),
             _op(_JSET, CLONE_NEW_FLAGS, jf=1), _op(_RET, eperm),
             _op(_RET, _ALLOW)]
    return b"".join(prog)
