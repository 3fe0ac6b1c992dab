"""The in-namespace half of the sandbox: run as `python -I -S sandbox_init.py SPEC_JSON`.

Only the standard library, because it runs before (and outside) any site-packages. Process tree:

    helper (host namespaces)     writes the child's uid/gid map, relays nothing but its own exit
     └ child (new user+mount+net+ipc+uts ns; opens bind sources, then becomes uid 0 inside)
        └ init (pid 1 of a new pid ns: builds the root, pivots, drops every capability)
           └ payload (rlimits, niceness, then exec)

Killing the helper kills the child (PDEATHSIG), which kills init (PDEATHSIG), and the kernel kills
every process of a pid namespace when its init dies: nothing the payload forks can outlive a run.
init reports "R" (set up) and "X <wait status>" on the status pipe; the payload never holds it,
so it cannot forge either.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import json
import os
import resource
import signal
import socket
import struct
import sys

NEWNS, NEWUTS, NEWIPC = 0x00020000, 0x04000000, 0x08000000
NEWUSER, NEWPID, NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
LOCKED_FLAGS = MS_NOSUID | MS_NODEV | MS_NOEXEC | 1024 | 2048 | 4096  # + noatime, nodiratime, relatime
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP = 1, 4, 24
PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS, PR_CAP_AMBIENT = 28, 38, 47
SECBITS_LOCKED_NOROOT = 0x2F  # noroot, no_setuid_fixup, keep_caps off: all locked

libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)


class SetupError(Exception):
    pass


def check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    check(libc.mount(enc(src), enc(dst), enc(fstype), ctypes.c_ulong(flags), enc(data)), f"mount {src} -> {dst}")


def remount_readonly(dst: str) -> None:
    """Read-only remount of `dst` and of every mount below it (a recursive bind copies submounts).

    In a user namespace the inherited nosuid/nodev/noexec/atime flags are locked, so they must
    be repeated or the kernel refuses the remount."""
    with open("/proc/self/mountinfo") as f:
        points = [line.split()[4] for line in f]
    for point in points:
        point = point.replace("\\040", " ")
        if point == dst or point.startswith(dst.rstrip("/") + "/"):
            keep = os.statvfs(point).f_flag & LOCKED_FLAGS
            mount(None, point, None, MS_BIND | MS_REMOUNT | MS_RDONLY | keep)


def write_file(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def makedirs_for(target: str, is_dir: bool) -> None:
    os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
    if not is_dir and not os.path.exists(target):
        open(target, "w").close()


def loopback_up() -> None:
    # Loopback-only networking inside the empty net namespace: tests may use localhost sockets.
    ifreq = struct.pack("16sH14s", b"lo", 0, b"")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH14s", fcntl.ioctl(s, 0x8913, ifreq))[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", b"lo", flags | 1, b""))  # SIOCSIFFLAGS, IFF_UP


def drop_privileges() -> None:
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() != 22:  # EINVAL: no such cap
            check(-1, f"drop capability {cap}")
    libc.prctl(PR_CAP_AMBIENT, 4, 0, 0, 0)  # clear ambient set (may be unsupported: ignore)
    check(libc.prctl(PR_SET_SECUREBITS, SECBITS_LOCKED_NOROOT, 0, 0, 0), "securebits")
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = ctypes.create_string_buffer(24)  # two empty {effective, permitted, inheritable}
    check(libc.capset(ctypes.c_char_p(header), data), "capset")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def build_root(spec: dict, fds: dict[str, int]) -> None:
    root = spec["root"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=16m,mode=755")
    for b in spec["binds"]:
        target = root + b["dst"]
        makedirs_for(target, b["dir"])
        mount(f"/proc/self/fd/{fds[b['dst']]}", target, None, MS_BIND | MS_REC)
        if not b["rw"]:
            remount_readonly(target)
    for dst in spec["masks"]:
        mount("tmpfs", root + dst, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=555")
    for dst, target in spec["symlinks"]:
        os.symlink(target, root + dst)
    for dst, text in spec["files"]:
        makedirs_for(root + dst, False)
        write_file(root + dst, text)
    os.makedirs(root + "/tmp", exist_ok=True)
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, f"size={spec['tmp_mb']}m,mode=1777")
    os.makedirs(root + "/dev/shm", exist_ok=True)
    mount("tmpfs", root + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=64m,mode=1777")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, f"{root}/dev/{name}")
    os.makedirs(root + "/proc", exist_ok=True)
    mount("proc", root + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.makedirs(root + "/.old", exist_ok=True)
    os.chdir(root)
    check(libc.pivot_root(b".", b".old"), "pivot_root")
    os.chdir("/")
    check(libc.umount2(b"/.old", MNT_DETACH), "detach old root")
    os.rmdir("/.old")
    mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)


def limit_and_exec(spec: dict, status_fd: int) -> None:
    os.close(status_fd)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    for name, value in spec["rlimits"].items():
        hard = value + 1 if name == "CPU" else value  # CPU: SIGXCPU at soft, SIGKILL a second later
        resource.setrlimit(getattr(resource, f"RLIMIT_{name}"), (value, hard))
    os.nice(spec["nice"])
    os.chdir(spec["cwd"])
    try:
        os.execvpe(spec["argv"][0], spec["argv"], spec["env"])
    except OSError as e:
        os.write(2, f"sandbox: cannot run {spec['argv'][0]!r}: {e.strerror}\n".encode())
    os._exit(127)


def init(spec: dict, fds: dict[str, int], status_fd: int) -> None:
    """pid 1 of the sandbox's pid namespace."""
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    libc.sethostname(b"sandbox", 7)
    loopback_up()
    build_root(spec, fds)
    for fd in fds.values():
        os.close(fd)
    try:  # no nested user namespaces: nothing in the sandbox needs to regain capabilities
        write_file("/proc/sys/user/max_user_namespaces", "0")
    except OSError:
        pass
    drop_privileges()
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the payload cannot ptrace or read init's memory
    payload = os.fork()
    if payload == 0:
        limit_and_exec(spec, status_fd)
    os.write(status_fd, b"R\n")
    while True:  # reap everything; the payload's end ends the namespace (and all it left behind)
        pid, status = os.wait()
        if pid == payload:
            os.write(status_fd, f"X {status}\n".encode())
            os._exit(0)


def child(spec: dict, helper: int, ready_w: int, go_r: int, status_fd: int) -> None:
    check(libc.unshare(NEWUSER | NEWNS | NEWNET | NEWIPC | NEWUTS | NEWPID), "unshare")
    # Still the host uid here: open every bind source now, so that a 0700 parent directory
    # (/root, for the interpreter) does not block the mount once we are the unprivileged uid.
    fds = {b["dst"]: os.open(b["src"], os.O_PATH) for b in spec["binds"]}
    os.write(ready_w, b"u")
    if os.read(go_r, 1) != b"g":
        raise SetupError("the helper did not write the uid map")
    if spec["clear_groups"]:
        os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # a uid change cleared it
    if os.getppid() != helper:
        os._exit(125)
    pid = os.fork()
    if pid == 0:
        try:
            init(spec, fds, status_fd)
        except BaseException as e:  # noqa: BLE001 - reported through the status pipe
            os.write(status_fd, f"E sandbox init: {e}\n".encode())
            os._exit(125)
    os.write(status_fd, f"P {pid}\n".encode())  # the host kills this pid to end the namespace
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


def write_maps(pid: int, uid: int, gid: int, privileged: bool) -> None:
    if not privileged:  # an unprivileged writer may only map itself, and only with setgroups denied
        write_file(f"/proc/{pid}/setgroups", "deny")
    write_file(f"/proc/{pid}/uid_map", f"0 {uid} 1\n")
    write_file(f"/proc/{pid}/gid_map", f"0 {gid} 1\n")


def main() -> None:
    spec = json.loads(sys.argv[1])
    status_fd = spec["status_fd"]
    try:
        for procs in spec["cgroup_procs"]:
            write_file(procs, str(os.getpid()))
        privileged = os.geteuid() == 0
        uid, gid = (spec["uid"], spec["gid"]) if privileged else (os.geteuid(), os.getegid())
        spec["clear_groups"] = privileged
        ready_r, ready_w = os.pipe()
        go_r, go_w = os.pipe()
        helper = os.getpid()
        pid = os.fork()
        if pid == 0:
            try:
                child(spec, helper, ready_w, go_r, status_fd)
            except BaseException as e:  # noqa: BLE001
                os.write(status_fd, f"E sandbox child: {e}\n".encode())
                os._exit(125)
        if os.read(ready_r, 1) == b"u":
            write_maps(pid, uid, gid, privileged)
            os.write(go_w, b"g")
    except BaseException as e:  # noqa: BLE001
        os.write(status_fd, f"E sandbox helper: {e}\n".encode())
        os._exit(125)
    _, status = os.waitpid(pid, 0)
    os._exit(os.waitstatus_to_exitcode(status) % 256)


if __name__ == "__main__":
    main()
