"""Stage 1 of the sandbox: pid 1 of fresh pid/net/mount/ipc namespaces, root, stdlib only.

    unshare --net --pid --mount --ipc --fork --kill-child --mount-proc  python -I -S <this>
      stdin: {"harness", "job", "uid", "hide", "keep", "python", "tmpfs_mb", "status_fd"}
      private tmpfs on /tmp (the working dir lives there and dies with the namespace)
      empty tmpfs over every hidden path (/etc, /root, /home, the project's top dir, ...)
      the interpreter's prefix bound back read-only where it was
      fork -> child: drop to the sandbox uid, cd /tmp/work, exec the harness (stage 2)
      wait -> "ready" and then the child's exit code (128 + signal) on the status fd,
              which the program never holds, so it cannot forge its own fate

When this process exits the kernel kills everything left in the pid namespace, so a
forked or daemonized program cannot outlive its sandbox.
"""

import ctypes
import json
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_MOVE, MS_REC = (
    1, 2, 4, 32, 4096, 8192, 16384)
libc = ctypes.CDLL(None, use_errno=True)


def mount(src: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    if libc.mount(src.encode(), target.encode(), fstype.encode() if fstype else None,
                  flags, data.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {target}: {os.strerror(err)}")


cfg = json.loads(sys.stdin.read())
uid, keep = cfg["uid"], cfg["keep"]
status_out = os.fdopen(cfg["status_fd"], "w")

mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={cfg['tmpfs_mb']}m,mode=1777")
hidden = any(keep == h or keep.startswith(h.rstrip("/") + "/") for h in cfg["hide"])
if hidden:                      # park the interpreter's prefix before covering its parent
    os.mkdir("/tmp/.keep")
    mount(keep, "/tmp/.keep", None, MS_BIND | MS_REC)
for path in cfg["hide"]:
    if os.path.isdir(path):
        mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, "size=64k,mode=755")
if hidden:
    os.makedirs(keep, exist_ok=True)
    mount("/tmp/.keep", keep, None, MS_MOVE)
    mount("none", keep, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
os.mkdir("/tmp/work", 0o700)
os.chown("/tmp/work", uid, uid)

status_out.write("ready\n")
status_out.flush()
pid = os.fork()
if pid == 0:
    status_out.close()
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    os.chdir("/tmp/work")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp/work"}
    os.execve(cfg["python"], [cfg["python"], "-I", "-S", "-c", cfg["harness"], cfg["job"]], env)
_, status = os.waitpid(pid, 0)
code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
status_out.write(f"exit {code}\n")
status_out.flush()
os._exit(0)
