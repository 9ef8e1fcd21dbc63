# The native jail's escape suite (tests/jail_attacks.rs and harden_seccomp.rs), run inside a
# harness container. Prints "ok:NAME" for every attack that failed as it must, "ESCAPE:NAME
# DETAIL" for any that worked (or failed for another reason than the wall that should stop
# it), then "END". Arguments: a host file outside the binds, a path outside the project to
# create, a host process id, the marker in that process's environment, a host TCP port on
# 127.0.0.1, a host TCP port on every address (IPv4 and IPv6), a host abstract socket name, the
# host's addresses (comma-separated; IPv6 link-local ones are tried on the container's eth0).
import ctypes, errno, fcntl, os, pty, socket, subprocess, sys, termios

secret, outside, host_pid, marker, lo_port, any_port, abstract, host_addrs = sys.argv[1:9]
libc = ctypes.CDLL(None, use_errno=True)
NR = {  # syscall numbers: x86_64, aarch64
    "ptrace": (101, 117), "personality": (135, 92), "keyctl": (250, 219), "bpf": (321, 280),
    "perf_event_open": (298, 241), "userfaultfd": (323, 282), "io_uring_setup": (425, 425),
    "name_to_handle_at": (303, 264), "open_by_handle_at": (304, 265), "setns": (308, 268),
    "fchmodat": (268, 53), "fchmodat2": (452, 452), "unshare": (272, 97), "mount": (165, 40),
}
ARCH = {"x86_64": 0, "aarch64": 1}[os.uname().machine]


def report(name, escaped, detail=""):
    print(("ESCAPE:" if escaped else "ok:") + name + (" " + str(detail) if detail else ""),
          flush=True)


def sys_errno(name, *args):
    """The errno of a raw syscall, 0 when it succeeded."""
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(NR[name][ARCH]), *[ctypes.c_long(a) for a in args])
    return 0 if r >= 0 else ctypes.get_errno()


def refused(name, call, *errnos):
    """`call` must raise OSError (with one of `errnos` when given)."""
    try:
        call()
    except OSError as e:
        report(name, bool(errnos) and e.errno not in errnos, errno.errorcode.get(e.errno))
        return
    report(name, True, "succeeded")


def filtered(name, *args, want=errno.EPERM):
    """A raw syscall must fail with the filter's errno."""
    e = sys_errno(name, *args)
    report("seccomp-" + name, e != want, errno.errorcode.get(e, e))


def in_child(fn):
    """Run fn in a forked child (it may change the process); its exit code is fn's."""
    pid = os.fork()
    if pid == 0:
        try:
            os._exit(fn())
        except BaseException:
            os._exit(99)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


# -- host files: outside the binds, the policy file, the read-only root.
refused("read-host-secret", lambda: open(secret).read())
try:  # lands in the container's own /tmp at most: the test looks for it on the host
    open(outside, "w").close()
except OSError:
    pass
refused("write-etc", lambda: open("/etc/corral-escape", "w"))
refused("write-policy", lambda: open("corral.toml", "a"))

# -- host processes: signal one, read any environment that holds its marker.
refused("kill-host-process", lambda: os.kill(int(host_pid), 9))
leaked = []
for p in os.listdir("/proc"):
    if p.isdigit():
        try:
            if marker.encode() in open("/proc/%s/environ" % p, "rb").read():
                leaked.append(p)
        except OSError:
            pass
report("host-environment", bool(leaked), leaked)

# -- host services: loopback TCP, every address via the gateway, abstract unix sockets.
def connect(fam, addr):
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(addr)


refused("host-loopback-tcp", lambda: connect(socket.AF_INET, ("127.0.0.1", int(lo_port))))
refused("host-abstract-socket", lambda: connect(socket.AF_UNIX, "\0" + abstract))
gateways = set()
for line in open("/proc/net/route").readlines()[1:]:
    f = line.split()
    dest, mask = int(f[1], 16), int(f[7], 16)
    if dest and mask:  # this network's first address: where a bridge gateway sits
        gateways.add(socket.inet_ntoa((dest + (1 << 24)).to_bytes(4, "little")))
for gw in sorted(gateways) + ["172.17.0.1", "10.88.0.1", "1.1.1.1"]:
    refused("reach-host-via-" + gw, lambda: connect(socket.AF_INET, (gw, int(any_port))))
for addr in host_addrs.split(","):
    if ":" in addr:
        scope = socket.if_nametoindex("eth0") if addr.startswith("fe80") and os.path.exists(
            "/sys/class/net/eth0") else 0
        target = (socket.AF_INET6, (addr, int(any_port), 0, scope))
    else:
        target = (socket.AF_INET, (addr, int(any_port)))
    refused("reach-host-at-" + addr, lambda: connect(*target))

# -- namespaces and mounts.
for name, argv in [("userns", ["unshare", "-U", "true"]), ("userns-root", ["unshare", "-Ur", "true"]),
                   ("mountns", ["unshare", "-m", "true"]),
                   ("mount-tmpfs", ["mount", "-t", "tmpfs", "none", "/tmp"]),
                   ("bind-mount", ["mount", "--bind", "/", "/tmp"])]:
    r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    report(name, r.returncode == 0)
filtered("unshare", 0x10000000)
filtered("mount", 0, 0, 0, 0, 0)
filtered("setns", -1, 0)

# -- devices and kernel interfaces.
for dev in ["/dev/sda", "/dev/vda", "/dev/nvme0n1", "/dev/kmsg", "/dev/mem", "/dev/kmem",
            "/dev/port", "/dev/loop0", "/dev/console"]:
    refused("open-" + dev, lambda: open(dev, "rb").read(1))
refused("read-kcore", lambda: open("/proc/kcore", "rb").read(1))
refused("sysrq-trigger", lambda: open("/proc/sysrq-trigger", "w").write("h"))
refused("write-proc-sys", lambda: open("/proc/sys/kernel/hostname", "w").write("x"))
refused("write-sys", lambda: open("/sys/kernel/mm/ksm/run", "w").write("1"))

# -- terminal injection: TIOCSTI on a pty that is the caller's controlling terminal (without
#    the filter the kernel allows it there, or answers EIO when legacy TIOCSTI is off).
master, slave = pty.openpty()


def tiocsti():
    os.setsid()
    fd = os.open(os.ttyname(slave), os.O_RDWR)
    fcntl.ioctl(fd, termios.TIOCSCTTY, 0)
    try:
        fcntl.ioctl(fd, termios.TIOCSTI, b"x")
    except OSError as e:
        return e.errno
    return 0


code = in_child(tiocsti)
report("tiocsti", code != errno.EPERM, errno.errorcode.get(code, code))

# -- sockets: raw packets, the hypervisor, netlink beyond routing.
refused("af-packet", lambda: socket.socket(17, socket.SOCK_RAW, 0), errno.EAFNOSUPPORT)
refused("af-vsock", lambda: socket.socket(40, socket.SOCK_STREAM, 0), errno.EAFNOSUPPORT)
refused("netlink-uevent", lambda: socket.socket(16, socket.SOCK_RAW, 15), errno.EAFNOSUPPORT)
refused("raw-inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, 1))

# -- set-id files left in the project for the host.
open("setid.bin", "w").close()
refused("chmod-setuid", lambda: os.chmod("setid.bin", 0o4755), errno.EPERM)
refused("chmod-setgid", lambda: os.chmod("setid.bin", 0o2755), errno.EPERM)
path = ctypes.create_string_buffer(b"setid.bin")
filtered("fchmodat", -100, ctypes.addressof(path), 0o4755)
filtered("fchmodat2", -100, ctypes.addressof(path), 0o4755, 0)
refused("create-setuid", lambda: os.open("setid2.bin", os.O_CREAT | os.O_WRONLY, 0o4755),
        errno.EPERM)

# -- other processes' memory and the kernel's big surfaces.
filtered("ptrace", 0, 0, 0, 0)  # PTRACE_TRACEME
filtered("personality", 0x0040000)  # ADDR_NO_RANDOMIZE
filtered("keyctl", 0, 0, 0, 0)
filtered("bpf", 0, 0, 0)
filtered("perf_event_open", 0, 0, -1, -1, 0)
filtered("userfaultfd", 0)
filtered("io_uring_setup", 1, 0)
filtered("name_to_handle_at", -100, 0, 0, 0, 0)
filtered("open_by_handle_at", -1, 0, 0)
print("END", flush=True)
