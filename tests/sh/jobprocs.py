#!/usr/bin/env python3
"""What the processes of a running baton job hold, read from /proc.

A helper of the shell tests (tests/run.sh runs only tests/sh/*.sh):

  jobprocs.py procs DRIVER            the driver's pid, then its workers' (its
                                      children but the run directory's guard)
  jobprocs.py guard DRIVER            the run directory guard's pid
  jobprocs.py listening PID...        "PID HOST PORT" per listening TCP socket
  jobprocs.py attack HOST PORT [WAIT] hostile bytes, each on a fresh connection;
                                      WAIT seconds (default 1) for the process
                                      to close each (0 for a stopped one)
  jobprocs.py datagrams PID...        hostile datagrams to every abstract unix
                                      socket of each PID (UCX's shared-memory
                                      wake-up sockets: any local user can
                                      reach them); prints "N sockets, M datagrams"
  jobprocs.py sockets PID...          every inet socket; exit 1 unless all are
                                      bound to loopback
  jobprocs.py inherited DRIVER PID... exit 1 when a PID holds an open file of
                                      the driver (other than fds 0-2)
  jobprocs.py cloexec OUTSIDE PID...  exit 1 when a PID holds an fd >= 3
                                      without close-on-exec, not counting
                                      files it shares with process OUTSIDE
                                      (what the job inherited from the test)

Socket ownership: the inode of /proc/PID/fd/N ("socket:[INODE]") matched
against /proc/PID/net/{tcp,tcp6,udp,udp6}. "Same open file" is kcmp(2)
KCMP_FILE, exact for every kind of descriptor (anonymous inodes such as
eventfds all share one inode number, so comparing inodes would not do).
"""
import ctypes
import os
import random
import socket
import sys

TCP_LISTEN = 0x0A
O_CLOEXEC = 0o2000000
SYS_KCMP = {"x86_64": 312, "aarch64": 272}.get(os.uname().machine)
KCMP_FILE = 0
libc = ctypes.CDLL(None, use_errno=True)


def fds(pid):
    """{fd: readlink target} of pid (fds that vanish while we look are skipped)."""
    out = {}
    base = f"/proc/{pid}/fd"
    for name in os.listdir(base):
        try:
            out[int(name)] = os.readlink(f"{base}/{name}")
        except OSError:
            pass
    return out


def socket_inodes(pid):
    """{inode: fd} of the sockets pid holds."""
    out = {}
    for fd, target in fds(pid).items():
        if target.startswith("socket:["):
            out[int(target[8:-1])] = fd
    return out


def addr_decode(hexaddr, v6):
    host, port = hexaddr.split(":")
    raw = bytes.fromhex(host)
    if not v6:
        return socket.inet_ntop(socket.AF_INET, raw[::-1]), int(port, 16)
    # four 32-bit words, each in host (little-endian) order
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words), int(port, 16)


def inet_sockets(pid):
    """[(proto, fd, host, port, state)] of pid's inet sockets."""
    mine = socket_inodes(pid)
    out = []
    for proto in ("tcp", "tcp6", "udp", "udp6"):
        try:
            lines = open(f"/proc/{pid}/net/{proto}").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            inode = int(f[9])
            if inode in mine:
                host, port = addr_decode(f[1], proto.endswith("6"))
                out.append((proto, mine[inode], host, port, int(f[3], 16)))
    return out


def is_loopback(host):
    if host.startswith("::ffff:"):
        host = host[7:]
    return host.startswith("127.") or host == "::1"


def same_file(pid1, fd1, pid2, fd2):
    if SYS_KCMP is None:
        raise SystemExit("kcmp: unknown syscall number on " + os.uname().machine)
    r = libc.syscall(SYS_KCMP, pid1, pid2, KCMP_FILE, fd1, fd2)
    if r < 0:
        err = ctypes.get_errno()
        if err == 9:  # EBADF: one of the fds closed while we looked
            return False
        raise SystemExit(f"kcmp({pid1}, {pid2}): {os.strerror(err)}")
    return r == 0


def children(pid):
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = open(f"/proc/{name}/stat").read()
        except OSError:
            continue
        # the command name may hold spaces: the ppid follows its ')'
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])
        if ppid == pid:
            kids.append(int(name))
    return sorted(kids)


def comm(pid):
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def cmd_procs(args):
    # the run directory's guard (launch/jobdir.c, named baton-guard) is a
    # child of the driver too, but no rank: it holds no socket and closed
    # everything it inherited
    driver = int(args[0])
    kids = [p for p in children(driver) if comm(p) != "baton-guard"]
    print(" ".join(str(p) for p in [driver] + kids))


def cmd_guard(args):
    guards = [p for p in children(int(args[0])) if comm(p) == "baton-guard"]
    print(" ".join(str(p) for p in guards))


def cmd_listening(args):
    for pid in map(int, args):
        for proto, fd, host, port, state in inet_sockets(pid):
            if proto.startswith("tcp") and state == TCP_LISTEN:
                print(pid, host, port)


def payloads():
    """The hostile inputs: zero runs around UCX 1.13's 16-byte connection
    manager header, a zero run longer than any handshake, and random bytes
    of several sizes (fixed seed: the same bytes on every run)."""
    rng = random.Random(20240917)
    yield b"\0" * 17
    yield b"\0" * 16
    yield b"\0" * 64
    yield b"\0" * 4096
    for n in (1, 17, 100, 1000, 65536):
        yield rng.randbytes(n)
    yield b"\xff" * 256


def cmd_attack(args):
    host, port = args[0], int(args[1])
    wait = float(args[2]) if len(args) > 2 else 1.0
    if host in ("0.0.0.0", "::"):
        host = "127.0.0.1" if host == "0.0.0.0" else "::1"
    sent = cut = 0
    for data in payloads():
        try:
            s = socket.create_connection((host, port), timeout=2)
        except OSError as e:
            print(f"{host}:{port}: connect: {e}")
            continue
        # accepted: the bytes go to the process (it may read enough of them
        # to refuse the rest and close first, which a slow sender, beside a
        # sanitizer build, sees as a reset or a closed socket)
        sent += 1
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            # give the process time to read it: wait for its close (bounded)
            if wait > 0:
                s.settimeout(wait)
                while s.recv(65536):
                    pass
        except OSError as e:
            if not isinstance(e, TimeoutError):
                cut += 1
        finally:
            s.close()
    if cut:
        print(f"{host}:{port}: {cut} closed by the process before all bytes were sent")
    print(f"{host}:{port}: {sent} hostile connections")


def cmd_datagrams(args):
    socks = sent = 0
    for pid in map(int, args):
        mine = socket_inodes(pid)
        for line in open(f"/proc/{pid}/net/unix").read().splitlines()[1:]:
            f = line.split()
            # Num RefCount Protocol Flags Type St Inode Path; type 2: SOCK_DGRAM
            if len(f) < 8 or int(f[6]) not in mine or f[4] != "0002" or not f[7].startswith("@"):
                continue
            socks += 1
            s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            for data in payloads():
                try:
                    s.sendto(data[:4096], "\0" + f[7][1:])
                    sent += 1
                except OSError:
                    pass
            s.close()
    print(f"{socks} sockets, {sent} datagrams")


def cmd_sockets(args):
    bad = 0
    for pid in map(int, args):
        for proto, fd, host, port, state in inet_sockets(pid):
            ok = is_loopback(host)
            bad += not ok
            print(f"pid {pid} fd {fd} {proto} {host}:{port} state {state:02X}"
                  f"{'' if ok else '  NOT LOOPBACK'}")
    sys.exit(1 if bad else 0)


def cmd_inherited(args):
    driver, others = int(args[0]), [int(a) for a in args[1:]]
    dfds = [fd for fd in fds(driver) if fd > 2]
    bad = 0
    for pid in others:
        for fd, target in sorted(fds(pid).items()):
            if fd <= 2:
                continue
            for dfd in dfds:
                if same_file(pid, fd, driver, dfd):
                    print(f"pid {pid} fd {fd} ({target}) is the driver's fd {dfd}")
                    bad += 1
                    break
    sys.exit(1 if bad else 0)


def fd_flags(pid, fd):
    try:
        for line in open(f"/proc/{pid}/fdinfo/{fd}"):
            if line.startswith("flags:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    return None


def cmd_cloexec(args):
    outside, pids = int(args[0]), [int(a) for a in args[1:]]
    ofds = list(fds(outside))
    bad = 0
    for pid in pids:
        for fd, target in sorted(fds(pid).items()):
            if fd <= 2:
                continue
            flags = fd_flags(pid, fd)
            if flags is None or flags & O_CLOEXEC:
                continue
            if any(same_file(pid, fd, outside, o) for o in ofds):
                continue  # inherited from the test itself, not made by the job
            print(f"pid {pid} fd {fd} ({target}) is not close-on-exec")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    cmds = {"procs": cmd_procs, "guard": cmd_guard, "listening": cmd_listening, "attack": cmd_attack, "datagrams": cmd_datagrams,
            "sockets": cmd_sockets, "inherited": cmd_inherited, "cloexec": cmd_cloexec}
    if len(sys.argv) < 2 or sys.argv[1] not in cmds:
        raise SystemExit(__doc__)
    cmds[sys.argv[1]](sys.argv[2:])
