//! The jail's seccomp filter: a deny-list, hand-built as classic BPF.
//!
//! The rules are data ([`rules`]), compiled twice: into the BPF the native jail installs
//! ([`build_filter`]) and into the OCI profile the container backend gives its containers
//! ([`oci_profile`]); a unit test runs both on the same calls.
//!
//! The filter is installed last in the child's set-up (after pivot_root, Landlock and the
//! capability drop, right before exec), so every syscall the set-up needed has already run.
//! It denies the kernel interfaces a coding agent has no use for and that widen the attack
//! surface or undo the jail: nested namespaces, mounts, kernel modules, BPF, perf, keyrings,
//! io_uring, userfaultfd, terminal injection, ptrace, clock and system changes, unusual
//! socket families, and set-user-ID/set-group-ID mode bits on files. Everything else is allowed: the namespaces, the mounts, Landlock, the
//! dropped capabilities and the cgroup are what confine the rest.
//!
//! Why hand-built BPF rather than `seccompiler`: two rules need more than an exact syscall
//! number and argument comparisons seccompiler can express: the x32 ABI (every syscall number
//! with bit 30 set on x86_64) and a per-rule errno (ENOSYS for `clone3` so that libc falls back
//! to `clone`, whose flags are in a register the filter can inspect; EAFNOSUPPORT for socket
//! families). The program is small and built by [`Program`], a tiny assembler with labels, and
//! every rule carries its reason below.
//!
//! Argument comparisons look at the low 32 bits of an argument only, on purpose: every argument
//! filtered here (ioctl request, clone/unshare flags, socket family and protocol, personality,
//! open flags, file modes) is an `int`/`unsigned int`/`umode_t` in the kernel, which ignores
//! the high half. Comparing all 64 bits
//! would let `ioctl(fd, 0x1_0000_5412)` (TIOCSTI with junk in the high half) slip through.

use std::io;

use thiserror::Error;

/// What went wrong installing the filter.
#[derive(Debug, Error)]
pub enum SeccompError {
    #[error("seccomp: prctl(PR_SET_NO_NEW_PRIVS) failed: {0}")]
    NoNewPrivs(io::Error),
    #[error(
        "seccomp: installing the filter failed: {0} (the kernel needs CONFIG_SECCOMP_FILTER; run `corral doctor`)"
    )]
    Install(io::Error),
    #[error("seccomp: this CPU architecture is not supported by corral's filter")]
    UnsupportedArch,
    #[error("seccomp: internal error building the filter: {0}")]
    Build(String),
}

// ---- classic BPF, as the kernel's <linux/filter.h> and <linux/seccomp.h> define it ----

const BPF_LD: u16 = 0x00;
const BPF_W: u16 = 0x00;
const BPF_ABS: u16 = 0x20;
const BPF_JMP: u16 = 0x05;
const BPF_JEQ: u16 = 0x10;
const BPF_JGE: u16 = 0x30;
const BPF_JSET: u16 = 0x40;
const BPF_K: u16 = 0x00;
const BPF_RET: u16 = 0x06;

const SECCOMP_RET_KILL_PROCESS: u32 = 0x8000_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;

/// Offsets in `struct seccomp_data { int nr; u32 arch; u64 ip; u64 args[6]; }`.
const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of `args[i]` (all supported architectures are little-endian).
const fn off_arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_003E; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH_NATIVE: u32 = 0xC000_00B7; // AUDIT_ARCH_AARCH64

/// x86_64 syscall numbers with this bit set are the x32 ABI.
#[cfg(target_arch = "x86_64")]
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

// Syscalls newer than the libc crate's tables (same number on every architecture).
const SYS_OPEN_TREE_ATTR: i64 = 467;
const SYS_FCHMODAT2: i64 = 452;

// File modes and open flags.
const S_ISUID: u32 = 0o4000;
const S_ISGID: u32 = 0o2000;
const SET_ID_BITS: u32 = S_ISUID | S_ISGID;
const O_CREAT: u32 = 0o100;
/// The bit O_TMPFILE adds to O_DIRECTORY (`__O_TMPFILE`, the same on x86_64 and aarch64).
const O_TMPFILE_BIT: u32 = 0o20_000_000;

// ioctl requests.
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541C;
const TIOCSETD: u32 = 0x5423;
// Names made by an ioctl rather than a path syscall, which the name gate (namegate.rs) could not
// see: btrfs snapshots and subvolumes (any name, `.git` included, and no Landlock hook), and
// bcachefs subvolumes.
const BTRFS_IOC_SNAP_CREATE: u32 = 0x5000_9401;
const BTRFS_IOC_SUBVOL_CREATE: u32 = 0x5000_940e;
const BTRFS_IOC_SNAP_CREATE_V2: u32 = 0x5000_9417;
const BTRFS_IOC_SUBVOL_CREATE_V2: u32 = 0x5000_9418;
const BCH_IOCTL_SUBVOLUME_CREATE: u32 = 0x4020_bc10;
/// Setting inode flags: the casefold flag would make a directory match `.GIT` to `.git` after
/// the gate checked a name (the gate asks a directory whether it folds names only when a
/// variant of a git name is created in it).
const FS_IOC_SETFLAGS: u32 = 0x4008_6602;
const FS_IOC32_SETFLAGS: u32 = 0x4004_6602;

// clone/unshare namespace flags.
const CLONE_NEWTIME: u32 = 0x0000_0080;
const CLONE_NEWNS: u32 = 0x0002_0000;
const CLONE_NEWCGROUP: u32 = 0x0200_0000;
const CLONE_NEWUTS: u32 = 0x0400_0000;
const CLONE_NEWIPC: u32 = 0x0800_0000;
const CLONE_NEWUSER: u32 = 0x1000_0000;
const CLONE_NEWPID: u32 = 0x2000_0000;
const CLONE_NEWNET: u32 = 0x4000_0000;
/// Every namespace flag `clone` understands. CLONE_NEWTIME is not among them: for `clone` the
/// low byte is the exit signal, and the kernel takes 0x80 from there.
const CLONE_NS_FLAGS: u32 = CLONE_NEWNS
    | CLONE_NEWCGROUP
    | CLONE_NEWUTS
    | CLONE_NEWIPC
    | CLONE_NEWUSER
    | CLONE_NEWPID
    | CLONE_NEWNET;

// personality(2) flags that weaken the address-space layout or protections.
const ADDR_NO_RANDOMIZE: u32 = 0x0004_0000;
const MMAP_PAGE_ZERO: u32 = 0x0010_0000;
const ADDR_COMPAT_LAYOUT: u32 = 0x0020_0000;
const READ_IMPLIES_EXEC: u32 = 0x0040_0000;
const ADDR_LIMIT_32BIT: u32 = 0x0080_0000;
const ADDR_LIMIT_3GB: u32 = 0x0800_0000;
const PERSONALITY_WEAKENING: u32 = ADDR_NO_RANDOMIZE
    | MMAP_PAGE_ZERO
    | ADDR_COMPAT_LAYOUT
    | READ_IMPLIES_EXEC
    | ADDR_LIMIT_32BIT
    | ADDR_LIMIT_3GB;
/// `personality(0xffffffff)` only queries the current persona.
const PERSONALITY_QUERY: u32 = 0xffff_ffff;

// Socket families and netlink protocols.
const AF_UNIX: u32 = 1;
const AF_INET: u32 = 2;
const AF_INET6: u32 = 10;
const AF_NETLINK: u32 = 16;
const NETLINK_ROUTE: u32 = 0;

/// One syscall the filter denies with EPERM, with the reason (listed by `corral doctor --json`).
#[derive(Debug, Clone, Copy)]
pub struct DeniedSyscall {
    pub name: &'static str,
    pub nr: i64,
    pub reason: &'static str,
}

macro_rules! deny {
    ($name:ident, $reason:expr) => {
        DeniedSyscall {
            name: stringify!($name),
            nr: sys_nr::$name,
            reason: $reason,
        }
    };
}

/// Syscall numbers by name for this architecture (the libc crate's tables, plus the few it
/// lacks).
#[allow(non_upper_case_globals)]
mod sys_nr {
    pub const mount: i64 = libc::SYS_mount;
    pub const umount2: i64 = libc::SYS_umount2;
    pub const pivot_root: i64 = libc::SYS_pivot_root;
    pub const chroot: i64 = libc::SYS_chroot;
    pub const move_mount: i64 = libc::SYS_move_mount;
    pub const open_tree: i64 = libc::SYS_open_tree;
    pub const open_tree_attr: i64 = super::SYS_OPEN_TREE_ATTR;
    pub const fsopen: i64 = libc::SYS_fsopen;
    pub const fsmount: i64 = libc::SYS_fsmount;
    pub const fsconfig: i64 = libc::SYS_fsconfig;
    pub const fspick: i64 = libc::SYS_fspick;
    pub const mount_setattr: i64 = libc::SYS_mount_setattr;
    pub const setns: i64 = libc::SYS_setns;
    pub const ptrace: i64 = libc::SYS_ptrace;
    pub const process_vm_readv: i64 = libc::SYS_process_vm_readv;
    pub const process_vm_writev: i64 = libc::SYS_process_vm_writev;
    pub const pidfd_getfd: i64 = libc::SYS_pidfd_getfd;
    pub const kexec_load: i64 = libc::SYS_kexec_load;
    pub const kexec_file_load: i64 = libc::SYS_kexec_file_load;
    pub const init_module: i64 = libc::SYS_init_module;
    pub const finit_module: i64 = libc::SYS_finit_module;
    pub const delete_module: i64 = libc::SYS_delete_module;
    pub const bpf: i64 = libc::SYS_bpf;
    pub const perf_event_open: i64 = libc::SYS_perf_event_open;
    pub const keyctl: i64 = libc::SYS_keyctl;
    pub const add_key: i64 = libc::SYS_add_key;
    pub const request_key: i64 = libc::SYS_request_key;
    pub const userfaultfd: i64 = libc::SYS_userfaultfd;
    pub const io_uring_setup: i64 = libc::SYS_io_uring_setup;
    pub const io_uring_enter: i64 = libc::SYS_io_uring_enter;
    pub const io_uring_register: i64 = libc::SYS_io_uring_register;
    pub const acct: i64 = libc::SYS_acct;
    pub const swapon: i64 = libc::SYS_swapon;
    pub const swapoff: i64 = libc::SYS_swapoff;
    pub const reboot: i64 = libc::SYS_reboot;
    pub const settimeofday: i64 = libc::SYS_settimeofday;
    pub const clock_settime: i64 = libc::SYS_clock_settime;
    pub const clock_adjtime: i64 = libc::SYS_clock_adjtime;
    pub const adjtimex: i64 = libc::SYS_adjtimex;
    pub const open_by_handle_at: i64 = libc::SYS_open_by_handle_at;
    pub const name_to_handle_at: i64 = libc::SYS_name_to_handle_at;
    pub const quotactl: i64 = libc::SYS_quotactl;
    pub const quotactl_fd: i64 = libc::SYS_quotactl_fd;
    pub const syslog: i64 = libc::SYS_syslog;
    pub const vhangup: i64 = libc::SYS_vhangup;
    pub const sethostname: i64 = libc::SYS_sethostname;
    pub const setdomainname: i64 = libc::SYS_setdomainname;
    // The syscalls rules look at the arguments of.
    pub const clone: i64 = libc::SYS_clone;
    pub const clone3: i64 = libc::SYS_clone3;
    pub const unshare: i64 = libc::SYS_unshare;
    pub const ioctl: i64 = libc::SYS_ioctl;
    pub const personality: i64 = libc::SYS_personality;
    pub const socket: i64 = libc::SYS_socket;
    pub const openat: i64 = libc::SYS_openat;
    pub const openat2: i64 = libc::SYS_openat2;
    pub const fchmod: i64 = libc::SYS_fchmod;
    pub const fchmodat: i64 = libc::SYS_fchmodat;
    pub const fchmodat2: i64 = super::SYS_FCHMODAT2;
    pub const mknodat: i64 = libc::SYS_mknodat;
    #[cfg(target_arch = "x86_64")]
    pub const open: i64 = libc::SYS_open;
    #[cfg(target_arch = "x86_64")]
    pub const creat: i64 = libc::SYS_creat;
    #[cfg(target_arch = "x86_64")]
    pub const chmod: i64 = libc::SYS_chmod;
    #[cfg(target_arch = "x86_64")]
    pub const mknod: i64 = libc::SYS_mknod;
    #[cfg(target_arch = "x86_64")]
    pub const iopl: i64 = libc::SYS_iopl;
    #[cfg(target_arch = "x86_64")]
    pub const ioperm: i64 = libc::SYS_ioperm;
    #[cfg(target_arch = "x86_64")]
    pub const uselib: i64 = libc::SYS_uselib;
}

/// The syscalls denied outright with EPERM, each with its reason.
pub fn denied_syscalls() -> Vec<DeniedSyscall> {
    let mut v = vec![
        // -- The filesystem view is fixed at set-up; none of these may change it afterwards.
        deny!(
            mount,
            "the jail's mounts are fixed at set-up; a new mount could reveal or remount host paths"
        ),
        deny!(
            umount2,
            "unmounting could uncover what a mount hides (masked files, the tmpfs root)"
        ),
        deny!(pivot_root, "the root is set once at set-up"),
        deny!(chroot, "the root is set once at set-up"),
        deny!(move_mount, "new mount API: same as mount"),
        deny!(open_tree, "new mount API: clones mount trees"),
        deny!(
            open_tree_attr,
            "new mount API: clones mount trees with new attributes"
        ),
        deny!(fsopen, "new mount API: creates filesystems"),
        deny!(fsmount, "new mount API: creates mounts"),
        deny!(fsconfig, "new mount API: configures filesystems"),
        deny!(fspick, "new mount API: reconfigures existing mounts"),
        deny!(mount_setattr, "would make read-only mounts writable"),
        // -- Namespaces: the jail's are final.
        deny!(setns, "joining another namespace would leave the jail's"),
        // -- Other processes' memory. ptrace is denied entirely, even of the jail's own children:
        //    host processes are already unreachable (the pid namespace hides them, and Landlock
        //    forbids ptrace across domains), but the tracing interface is a large kernel
        //    surface and coding agents do not need a debugger inside the jail (run one through
        //    the executor instead).
        deny!(
            ptrace,
            "debugging interface: reads and writes other processes' memory and registers"
        ),
        deny!(process_vm_readv, "reads another process's memory"),
        deny!(process_vm_writev, "writes another process's memory"),
        deny!(pidfd_getfd, "steals file descriptors from another process"),
        // -- The kernel itself.
        deny!(kexec_load, "loads a new kernel"),
        deny!(kexec_file_load, "loads a new kernel"),
        deny!(init_module, "loads kernel code"),
        deny!(finit_module, "loads kernel code"),
        deny!(delete_module, "unloads kernel code"),
        deny!(
            bpf,
            "eBPF: a large attack surface, a frequent source of kernel exploits"
        ),
        deny!(
            perf_event_open,
            "performance counters: side channels and a frequent source of kernel exploits"
        ),
        deny!(
            keyctl,
            "kernel keyrings are not namespaced: the user's keys would be reachable"
        ),
        deny!(add_key, "kernel keyrings are not namespaced"),
        deny!(request_key, "kernel keyrings are not namespaced"),
        deny!(userfaultfd, "makes kernel races reliably exploitable"),
        deny!(
            io_uring_setup,
            "io_uring bypasses seccomp for the operations it performs and has a long exploit history"
        ),
        deny!(io_uring_enter, "io_uring: see io_uring_setup"),
        deny!(io_uring_register, "io_uring: see io_uring_setup"),
        // -- System-wide state.
        deny!(acct, "process accounting is system-wide"),
        deny!(swapon, "swap is system-wide"),
        deny!(swapoff, "swap is system-wide"),
        deny!(reboot, "reboots the machine (or the pid namespace)"),
        deny!(settimeofday, "the clock is system-wide"),
        deny!(clock_settime, "the clock is system-wide"),
        deny!(clock_adjtime, "the clock is system-wide"),
        deny!(adjtimex, "the clock is system-wide"),
        deny!(
            open_by_handle_at,
            "opens files by handle, bypassing the mount namespace (the 'shocker' escape)"
        ),
        deny!(
            name_to_handle_at,
            "produces the handles open_by_handle_at consumes"
        ),
        deny!(quotactl, "filesystem quotas are host state"),
        deny!(quotactl_fd, "filesystem quotas are host state"),
        deny!(syslog, "the kernel log leaks host information"),
        deny!(vhangup, "hangs up the controlling terminal"),
        deny!(sethostname, "the hostname is set at set-up"),
        deny!(setdomainname, "the domain name is set at set-up"),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        deny!(iopl, "raw I/O port access"),
        deny!(ioperm, "raw I/O port access"),
        deny!(uselib, "obsolete loader interface"),
    ]);
    v
}

/// The rules that look at arguments, described for humans (docs and `corral doctor --json`).
pub const ARGUMENT_RULES: &[(&str, &str)] = &[
    (
        "clone3",
        "always ENOSYS: its flags live in memory the filter cannot read, so libc falls back to clone",
    ),
    (
        "clone",
        "EPERM with any CLONE_NEW* flag: no nested namespaces (a user namespace would give the jail capabilities again)",
    ),
    ("unshare", "EPERM with any CLONE_NEW* flag: as clone"),
    (
        "ioctl",
        "EPERM for TIOCSTI (injects input into a terminal), TIOCLINUX (console control), TIOCSETD (line disciplines: rarely used kernel code), btrfs snapshot/subvolume and bcachefs subvolume creation (names the name gate cannot see) and FS_IOC_SETFLAGS (the casefold flag); low 32 bits compared",
    ),
    (
        "personality",
        "EPERM for ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO and the legacy layouts: no weakening of ASLR",
    ),
    (
        "socket",
        "EAFNOSUPPORT unless AF_UNIX, AF_INET, AF_INET6, or AF_NETLINK with NETLINK_ROUTE",
    ),
    (
        "chmod, fchmod, fchmodat, fchmodat2, creat, mknod, mknodat",
        "EPERM when the mode has S_ISUID or S_ISGID: a set-id file left in the project or a read-write bind would run with the jail user's (or root's) identity for whoever starts it on the host",
    ),
    (
        "open, openat",
        "EPERM when O_CREAT or O_TMPFILE is set and the mode has S_ISUID or S_ISGID (as chmod)",
    ),
    (
        "openat2",
        "always ENOSYS: its flags and mode live in memory the filter cannot read, so libc falls back to openat",
    ),
    (
        "(x32 ABI, foreign architectures)",
        "x32 syscalls get ENOSYS; a syscall from another architecture (int 0x80) kills the process",
    ),
];

// ---- a tiny BPF assembler ----

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

#[derive(Debug, Clone, Copy)]
enum Target {
    Next,
    To(Label),
}

#[derive(Debug, Clone, Copy)]
enum Insn {
    Load(u32),
    Jump {
        op: u16,
        k: u32,
        jt: Target,
        jf: Target,
    },
    Ret(u32),
    Mark(Label),
}

#[derive(Default)]
struct Program {
    insns: Vec<Insn>,
    labels: usize,
}

impl Program {
    fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels - 1)
    }
    fn load(&mut self, off: u32) {
        self.insns.push(Insn::Load(off));
    }
    fn jump(&mut self, op: u16, k: u32, jt: Target, jf: Target) {
        self.insns.push(Insn::Jump { op, k, jt, jf });
    }
    fn ret(&mut self, action: u32) {
        self.insns.push(Insn::Ret(action));
    }
    fn mark(&mut self, l: Label) {
        self.insns.push(Insn::Mark(l));
    }

    /// Resolve labels into relative jump offsets.
    fn assemble(&self) -> Result<Vec<libc::sock_filter>, SeccompError> {
        let mut pos = vec![None; self.labels];
        let mut n = 0usize;
        for insn in &self.insns {
            match insn {
                Insn::Mark(Label(l)) => pos[*l] = Some(n),
                _ => n += 1,
            }
        }
        let mut out = Vec::with_capacity(n);
        for insn in &self.insns {
            let here = out.len();
            let rel = |t: Target| -> Result<u8, SeccompError> {
                match t {
                    Target::Next => Ok(0),
                    Target::To(Label(l)) => {
                        let at = pos[l].ok_or_else(|| {
                            SeccompError::Build(format!("label {l} never placed"))
                        })?;
                        let d = at.checked_sub(here + 1).ok_or_else(|| {
                            SeccompError::Build(format!("backward jump to label {l}"))
                        })?;
                        u8::try_from(d)
                            .map_err(|_| SeccompError::Build(format!("jump of {d} is too far")))
                    }
                }
            };
            match *insn {
                Insn::Mark(_) => {}
                Insn::Load(off) => out.push(libc::sock_filter {
                    code: BPF_LD | BPF_W | BPF_ABS,
                    jt: 0,
                    jf: 0,
                    k: off,
                }),
                Insn::Jump { op, k, jt, jf } => out.push(libc::sock_filter {
                    code: BPF_JMP | op | BPF_K,
                    jt: rel(jt)?,
                    jf: rel(jf)?,
                    k,
                }),
                Insn::Ret(action) => out.push(libc::sock_filter {
                    code: BPF_RET | BPF_K,
                    jt: 0,
                    jf: 0,
                    k: action,
                }),
            }
        }
        if out.len() > 4096 {
            return Err(SeccompError::Build(format!(
                "{} instructions exceed BPF_MAXINSNS",
                out.len()
            )));
        }
        Ok(out)
    }

    /// `if nr == syscall { <body> }`: the body must end every path with a return, so the
    /// accumulator (the syscall number) is intact when the next rule is reached.
    fn on_syscall(&mut self, nr: i64, body: impl FnOnce(&mut Program)) {
        let skip = self.label();
        self.jump(BPF_JEQ, nr as u32, Target::Next, Target::To(skip));
        body(self);
        self.mark(skip);
    }
}

const fn errno(e: i32) -> u32 {
    SECCOMP_RET_ERRNO | (e as u32 & 0xffff)
}

/// Build the filter program for this architecture.
pub fn build_filter() -> Result<Vec<libc::sock_filter>, SeccompError> {
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return Err(SeccompError::UnsupportedArch);

    let mut p = Program::default();

    // A syscall made through another architecture's entry point (int 0x80 on x86_64) is
    // numbered from another table, so no rule below would mean what it says: kill.
    let native = p.label();
    p.load(OFF_ARCH);
    p.jump(BPF_JEQ, AUDIT_ARCH_NATIVE, Target::To(native), Target::Next);
    p.ret(SECCOMP_RET_KILL_PROCESS);
    p.mark(native);

    p.load(OFF_NR);
    // The x32 ABI shares AUDIT_ARCH_X86_64 but numbers syscalls with bit 30 set; deny them all
    // (nothing in a jail is built for x32), so x32 aliases cannot bypass the rules below.
    #[cfg(target_arch = "x86_64")]
    {
        let native_abi = p.label();
        p.jump(
            BPF_JGE,
            X32_SYSCALL_BIT,
            Target::Next,
            Target::To(native_abi),
        );
        p.ret(errno(libc::ENOSYS));
        p.mark(native_abi);
    }

    // One block per syscall, in the order of `rules()`: consecutive rules of one syscall share
    // it. A syscall that matches no block gets a verdict independent of its arguments, which
    // the kernel caches (Linux 5.11+) and never runs the program for again.
    let rules = rules();
    for group in rules.chunk_by(|a, b| a.nr == b.nr) {
        p.on_syscall(group[0].nr, |p| {
            for rule in group {
                compile_rule(p, rule);
            }
            p.ret(SECCOMP_RET_ALLOW);
        });
    }

    p.ret(SECCOMP_RET_ALLOW);
    p.assemble()
}

/// `if every check holds { return errno }`, falling through to what follows otherwise.
fn compile_rule(p: &mut Program, rule: &Rule) {
    let next = p.label();
    for check in &rule.when {
        p.load(off_arg_lo(check.arg));
        match check.test {
            ArgTest::AnyBit(bits) => p.jump(BPF_JSET, bits, Target::Next, Target::To(next)),
            ArgTest::Eq(v) => p.jump(BPF_JEQ, v, Target::Next, Target::To(next)),
            ArgTest::NoneOf(values) => {
                for &v in values {
                    p.jump(BPF_JEQ, v, Target::To(next), Target::Next);
                }
            }
        }
    }
    p.ret(errno(rule.errno));
    p.mark(next);
}

/// A test on the low 32 bits of one syscall argument (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgTest {
    /// At least one of these bits is set.
    AnyBit(u32),
    /// Equal to this value.
    Eq(u32),
    /// Equal to none of these values.
    NoneOf(&'static [u32]),
}

/// One argument test of a [`Rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArgCheck {
    /// The argument's index (0 to 5).
    pub arg: u32,
    pub test: ArgTest,
}

/// One rule of the filter: the syscall fails with `errno` when every check holds (no check:
/// always). Rules are data, so the native jail's BPF ([`build_filter`]) and the container
/// backend's OCI profile ([`oci_profile`]) are built from the same list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub syscall: &'static str,
    pub nr: i64,
    pub errno: i32,
    pub when: Vec<ArgCheck>,
}

const fn check(arg: u32, test: ArgTest) -> ArgCheck {
    ArgCheck { arg, test }
}

macro_rules! rule {
    ($name:ident, $errno:expr, [$($check:expr),* $(,)?]) => {
        Rule {
            syscall: stringify!($name),
            nr: sys_nr::$name,
            errno: $errno,
            when: vec![$($check),*],
        }
    };
}

/// Every rule of the filter, in the order the BPF program checks them: the frequent syscalls
/// whose verdict depends on their arguments first (the kernel cannot cache their verdict and
/// runs the program each time; checking them first keeps their path a handful of instructions
/// long), the outright denials ([`denied_syscalls`], EPERM) last.
pub fn rules() -> Vec<Rule> {
    use ArgTest::{AnyBit, Eq, NoneOf};
    let eperm = libc::EPERM;
    let mut v = set_id_rules();
    v.extend([
        // clone3 passes its flags in a struct the filter cannot read: ENOSYS makes glibc
        // (2.34+) and musl fall back to clone, where the rule below sees the flags.
        rule!(clone3, libc::ENOSYS, []),
        // clone: flags are args[0] on x86_64 and aarch64. Deny any new namespace.
        rule!(clone, eperm, [check(0, AnyBit(CLONE_NS_FLAGS))]),
        // unshare: the same, plus CLONE_NEWTIME which only unshare and clone3 take.
        rule!(
            unshare,
            eperm,
            [check(0, AnyBit(CLONE_NS_FLAGS | CLONE_NEWTIME))]
        ),
        // ioctl: TIOCSTI pushes bytes into a terminal's input queue (a jailed process could
        // type commands into the user's shell if it held that terminal; the jail gets its own
        // pty, this is the second wall); TIOCLINUX can do the same on a virtual console;
        // TIOCSETD switches a terminal's line discipline, which loads rarely used kernel code
        // (n_hdlc, CVE-2017-2636).
        rule!(ioctl, eperm, [check(1, Eq(TIOCSTI))]),
        rule!(ioctl, eperm, [check(1, Eq(TIOCLINUX))]),
        rule!(ioctl, eperm, [check(1, Eq(TIOCSETD))]),
        // ioctls that make names or fold them (see the constants): the name gate's.
        rule!(ioctl, eperm, [check(1, Eq(BTRFS_IOC_SNAP_CREATE))]),
        rule!(ioctl, eperm, [check(1, Eq(BTRFS_IOC_SUBVOL_CREATE))]),
        rule!(ioctl, eperm, [check(1, Eq(BTRFS_IOC_SNAP_CREATE_V2))]),
        rule!(ioctl, eperm, [check(1, Eq(BTRFS_IOC_SUBVOL_CREATE_V2))]),
        rule!(ioctl, eperm, [check(1, Eq(BCH_IOCTL_SUBVOLUME_CREATE))]),
        rule!(ioctl, eperm, [check(1, Eq(FS_IOC_SETFLAGS))]),
        rule!(ioctl, eperm, [check(1, Eq(FS_IOC32_SETFLAGS))]),
        // personality: querying and ordinary personas are fine; flags that disable ASLR or make
        // data executable are not.
        rule!(
            personality,
            eperm,
            [
                check(0, NoneOf(&[PERSONALITY_QUERY])),
                check(0, AnyBit(PERSONALITY_WEAKENING)),
            ]
        ),
        // socket: the families a coding agent uses. AF_UNIX stays: programs use socketpairs
        // and local sockets among themselves, the mount namespace shows no host socket path,
        // and abstract sockets are confined by the jail's own network namespace (modes none
        // and proxy) and by Landlock's ABI 6 scope. AF_NETLINK only for NETLINK_ROUTE
        // (getaddrinfo and getifaddrs use it); the other netlink protocols expose host state
        // (uevents, audit, socket diagnostics). AF_PACKET, AF_VSOCK (reaches the hypervisor),
        // AF_ALG, Bluetooth, XDP and the rest get EAFNOSUPPORT, which programs treat as "not
        // available here".
        rule!(
            socket,
            libc::EAFNOSUPPORT,
            [check(0, NoneOf(&[AF_UNIX, AF_INET, AF_INET6, AF_NETLINK]))]
        ),
        rule!(
            socket,
            libc::EAFNOSUPPORT,
            [check(0, Eq(AF_NETLINK)), check(2, NoneOf(&[NETLINK_ROUTE]))]
        ),
    ]);
    v.extend(denied_syscalls().into_iter().map(|d| Rule {
        syscall: d.name,
        nr: d.nr,
        errno: eperm,
        when: Vec::new(),
    }));
    v
}

/// Set-user-ID and set-group-ID bits: a jail must not leave a file that runs as its user (or,
/// when corral runs as root, as root) for whoever starts it on the host. The project and the
/// read-write binds are mounted nosuid inside the jail, but not on the host, where such a
/// file keeps its bits. Every syscall that takes a mode is refused when the mode carries one:
/// chmod and its relatives, creat and mknod, and open/openat when they create (O_CREAT or
/// O_TMPFILE; without them the mode argument is ignored and may hold anything). S_ISGID is
/// refused for directories too (chmod cannot tell a directory from a file), which only
/// matters to `chmod g+s dir`: new directories still inherit a set-group-ID parent's bit, as
/// the kernel does that itself. mkdir/mkdirat are not filtered: the kernel keeps only the
/// permission and sticky bits of their mode. openat2 passes its flags and mode in a struct
/// the filter cannot read: ENOSYS makes libc and runtimes fall back to openat. Comes first:
/// openat is the most frequent syscall whose verdict depends on its arguments.
fn set_id_rules() -> Vec<Rule> {
    use ArgTest::AnyBit;
    let eperm = libc::EPERM;
    let creates = check(2, AnyBit(O_CREAT | O_TMPFILE_BIT));
    let set_id = |arg| check(arg, AnyBit(SET_ID_BITS));
    let mut v = vec![
        rule!(openat, eperm, [creates, set_id(3)]),
        rule!(fchmod, eperm, [set_id(1)]),
        rule!(fchmodat, eperm, [set_id(2)]),
        rule!(fchmodat2, eperm, [set_id(2)]),
        rule!(mknodat, eperm, [set_id(2)]),
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        rule!(
            open,
            eperm,
            [check(1, AnyBit(O_CREAT | O_TMPFILE_BIT)), set_id(2)]
        ),
        rule!(creat, eperm, [set_id(1)]),
        rule!(chmod, eperm, [set_id(1)]),
        rule!(mknod, eperm, [set_id(1)]),
    ]);
    v.push(rule!(openat2, libc::ENOSYS, []));
    v
}

// ---- the same rules as an OCI runtime-spec profile (`linux.seccomp`), for the containers ----

/// The rules as an OCI seccomp profile (runtime-spec `linux.seccomp`, the JSON `podman run` and
/// `docker run` take with `--security-opt seccomp=FILE`): allow by default, each rule an
/// `SCMP_ACT_ERRNO` entry with its errno.
///
/// libseccomp compares whole 64-bit arguments, and runc ORs (not ANDs) several comparisons of
/// one argument in an entry, so every test becomes `SCMP_CMP_MASKED_EQ` comparisons whose mask
/// has no high-half bit (the low 32 bits only, as in the BPF), at most one per argument per
/// entry: "any of these bits" is one entry per bit, "none of these values" the few masked
/// prefixes that cover every other 32-bit value, and the tests of one argument are merged into
/// one comparison. The architecture list is the native one only: libseccomp then refuses
/// syscalls of another architecture and the x32 ABI, as the BPF does.
pub fn oci_profile() -> Result<serde_json::Value, SeccompError> {
    profile_of(rules())
}

/// The syscalls the name gate itself makes that the rules refuse: it reads a caller's path
/// (process_vm_readv), takes the socket a caller binds (pidfd_getfd) and resolves paths with
/// openat2's RESOLVE flags.
pub const GATE_NEEDS: &[&str] = &["process_vm_readv", "pidfd_getfd", "openat2"];

/// The profile of a container whose command `corral gate-exec` starts (the name gate in a
/// container, namegate.rs): the rules without [`GATE_NEEDS`] for the container, since the
/// gate runs in it; gate-exec installs the whole filter ([`build_filter`]) on the command
/// before it runs it, so the command and everything it starts are held to every rule.
pub fn oci_profile_gated() -> Result<serde_json::Value, SeccompError> {
    profile_of(
        rules()
            .into_iter()
            .filter(|r| !GATE_NEEDS.contains(&r.syscall))
            .collect(),
    )
}

fn profile_of(rules: Vec<Rule>) -> Result<serde_json::Value, SeccompError> {
    #[cfg(target_arch = "x86_64")]
    let arch = "SCMP_ARCH_X86_64";
    #[cfg(target_arch = "aarch64")]
    let arch = "SCMP_ARCH_AARCH64";
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return Err(SeccompError::UnsupportedArch);

    let mut syscalls: Vec<serde_json::Value> = Vec::new();
    // Rules without checks, grouped by errno in one entry each.
    let mut outright: Vec<(i32, Vec<&'static str>)> = Vec::new();
    for rule in rules {
        if rule.when.is_empty() {
            match outright.iter_mut().find(|(e, _)| *e == rule.errno) {
                Some((_, names)) => names.push(rule.syscall),
                None => outright.push((rule.errno, vec![rule.syscall])),
            }
            continue;
        }
        for term in masked_terms(&rule.when) {
            let args: Vec<serde_json::Value> = term
                .iter()
                .map(|&(index, mask, value)| {
                    serde_json::json!({
                        "index": index,
                        "value": mask,
                        "valueTwo": value,
                        "op": "SCMP_CMP_MASKED_EQ",
                    })
                })
                .collect();
            syscalls.push(serde_json::json!({
                "names": [rule.syscall],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": rule.errno,
                "args": args,
            }));
        }
    }
    for (errno, names) in outright.into_iter().rev() {
        syscalls.insert(
            0,
            serde_json::json!({"names": names, "action": "SCMP_ACT_ERRNO", "errnoRet": errno}),
        );
    }
    Ok(serde_json::json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": [arch],
        "syscalls": syscalls,
    }))
}

/// `(argument, mask, value)`: the argument's low 32 bits, masked, equal the value.
type Masked = (u32, u32, u32);

/// The checks of a rule as a disjunction of conjunctions of masked comparisons, at most one
/// per argument in each conjunction: the rule holds exactly when one of the terms does.
fn masked_terms(checks: &[ArgCheck]) -> Vec<Vec<Masked>> {
    let mut terms: Vec<Vec<Masked>> = vec![Vec::new()];
    for c in checks {
        let alternatives = match c.test {
            ArgTest::AnyBit(bits) => (0..32)
                .map(|i| 1u32 << i)
                .filter(|b| bits & b != 0)
                .map(|b| (b, b))
                .collect(),
            ArgTest::Eq(v) => vec![(u32::MAX, v)],
            ArgTest::NoneOf(values) => complement(values),
        };
        let mut next = Vec::new();
        for term in &terms {
            for &(mask, value) in &alternatives {
                if let Some(t) = and_masked(term, (c.arg, mask, value))
                    && !next.contains(&t)
                {
                    next.push(t);
                }
            }
        }
        terms = next;
    }
    terms
}

/// A conjunction with one more comparison, merged with the one on the same argument (`None`:
/// the two cannot both hold).
fn and_masked(term: &[Masked], (arg, mask, value): Masked) -> Option<Vec<Masked>> {
    let mut t = term.to_vec();
    match t.iter_mut().find(|(a, _, _)| *a == arg) {
        Some((_, m, v)) => {
            if (*v ^ value) & *m & mask != 0 {
                return None;
            }
            *m |= mask;
            *v |= value;
        }
        None => t.push((arg, mask, value)),
    }
    t.sort_unstable();
    Some(t)
}

/// Masked comparisons that together match every 32-bit value except `values`: for each
/// prefix (from the top bit) shared with some of the values, the branch that none of them
/// takes. At most 32 per value.
fn complement(values: &[u32]) -> Vec<(u32, u32)> {
    fn walk(mask: u32, prefix: u32, bit: i32, values: &[u32], out: &mut Vec<(u32, u32)>) {
        if values.is_empty() {
            out.push((mask, prefix));
            return;
        }
        if bit < 0 {
            return; // every bit fixed, and equal to one of the values
        }
        let b = 1u32 << bit;
        for side in [0, b] {
            let rest: Vec<u32> = values.iter().copied().filter(|v| v & b == side).collect();
            walk(mask | b, prefix | side, bit - 1, &rest, out);
        }
    }
    let mut out = Vec::new();
    walk(0, 0, 31, values, &mut out);
    out
}

/// Set no_new_privs and install the filter on the calling thread (and what it execs).
///
/// Call it last in the child's set-up, right before exec: it denies `mount`, `pivot_root` and
/// friends. It allocates nothing after building the program, so `build_filter()` may be called
/// before fork and [`install_program`] after it.
pub fn install() -> Result<(), SeccompError> {
    let prog = build_filter()?;
    install_program(&prog)
}

/// Install an already built program (see [`build_filter`]).
pub fn install_program(prog: &[libc::sock_filter]) -> Result<(), SeccompError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(SeccompError::NoNewPrivs(io::Error::last_os_error()));
    }
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the program.
    let rc = unsafe {
        libc::prctl(
            libc::PR_SET_SECCOMP,
            libc::SECCOMP_MODE_FILTER,
            &fprog as *const libc::sock_fprog,
            0,
            0,
        )
    };
    if rc != 0 {
        return Err(SeccompError::Install(io::Error::last_os_error()));
    }
    Ok(())
}

// ---- the name gate's filter (namegate.rs) ----

/// The syscalls that create a name in a directory, and truncate(2): the name gate
/// (namegate.rs) performs each one itself after checking the name (and that it is not a
/// protected file the host replaced, namegate/protected.rs). open/openat only when they create
/// or write (O_CREAT, O_WRONLY, O_RDWR, O_TRUNC; an O_TMPFILE opens for writing, and its
/// `linkat` names it); openat2 never gets here (ENOSYS above).
pub(crate) fn gate_always() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_truncate,
        libc::SYS_mkdirat,
        libc::SYS_mknodat,
        libc::SYS_linkat,
        libc::SYS_symlinkat,
        libc::SYS_renameat2,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([
        libc::SYS_creat,
        libc::SYS_mkdir,
        libc::SYS_mknod,
        libc::SYS_link,
        libc::SYS_symlink,
        libc::SYS_rename,
        libc::SYS_renameat,
    ]);
    v
}

/// The name gate's filter: `SECCOMP_RET_USER_NOTIF` for every syscall that creates a name
/// ([`gate_always`], open/openat that create or write), EPERM for `landlock_restrict_self` (the gate
/// performs creations with the jail's own Landlock rights, so a Landlock domain nested inside
/// the jail would not bind them: refused rather than silently weakened), allow for the rest.
/// Installed after [`install`]'s filter: the kernel runs both and the stricter verdict wins,
/// so what that filter refuses (a set-id mode, another architecture) never reaches the gate.
pub fn build_gate_filter() -> Result<Vec<libc::sock_filter>, SeccompError> {
    build_gate_filter_with(false)
}

/// The syscalls the gate stops too when the run keeps a change record (corral-changes): the
/// removals and mode changes, which the record must see before they happen.
pub(crate) fn gate_recording() -> Vec<i64> {
    let mut v = vec![
        libc::SYS_unlinkat,
        libc::SYS_fchmod,
        libc::SYS_fchmodat,
        SYS_FCHMODAT2,
    ];
    #[cfg(target_arch = "x86_64")]
    v.extend([libc::SYS_unlink, libc::SYS_rmdir, libc::SYS_chmod]);
    v
}

/// [`build_gate_filter`], stopping [`gate_recording`]'s syscalls too when `recording`.
pub fn build_gate_filter_with(recording: bool) -> Result<Vec<libc::sock_filter>, SeccompError> {
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    return Err(SeccompError::UnsupportedArch);

    let mut p = Program::default();
    let native = p.label();
    p.load(OFF_ARCH);
    p.jump(BPF_JEQ, AUDIT_ARCH_NATIVE, Target::To(native), Target::Next);
    p.ret(SECCOMP_RET_ALLOW);
    p.mark(native);
    p.load(OFF_NR);
    #[cfg(target_arch = "x86_64")]
    {
        let native_abi = p.label();
        p.jump(
            BPF_JGE,
            X32_SYSCALL_BIT,
            Target::Next,
            Target::To(native_abi),
        );
        p.ret(SECCOMP_RET_ALLOW);
        p.mark(native_abi);
    }
    let writing = (libc::O_CREAT | libc::O_WRONLY | libc::O_RDWR | libc::O_TRUNC) as u32;
    let creating_open = |p: &mut Program, flags_arg: u32| {
        p.load(off_arg_lo(flags_arg));
        let plain = p.label();
        p.jump(BPF_JSET, writing, Target::Next, Target::To(plain));
        p.ret(libc::SECCOMP_RET_USER_NOTIF);
        p.mark(plain);
        p.ret(SECCOMP_RET_ALLOW);
    };
    p.on_syscall(libc::SYS_openat, |p| creating_open(p, 2));
    #[cfg(target_arch = "x86_64")]
    p.on_syscall(libc::SYS_open, |p| creating_open(p, 1));
    // umask(2) too: the gate keeps each caller's umask (reading it costs more than a
    // creation) and forgets them when one changes. No path: the gate lets it continue. And
    // bind(2), of every family: a Unix socket bound to a path is a name, and the family is the
    // descriptor's, which another thread can swap (dup2) after any check; the gate performs
    // every bind on the socket it took from the caller.
    let recorded = if recording {
        gate_recording()
    } else {
        Vec::new()
    };
    for nr in gate_always()
        .into_iter()
        .chain([libc::SYS_umask, libc::SYS_bind])
        .chain(recorded)
    {
        p.on_syscall(nr, |p| p.ret(libc::SECCOMP_RET_USER_NOTIF));
    }
    p.on_syscall(libc::SYS_landlock_restrict_self, |p| {
        p.ret(errno(libc::EPERM))
    });
    p.ret(SECCOMP_RET_ALLOW);
    p.assemble()
}

/// Install the gate's filter on this thread and return its listener: `None` when the kernel
/// lacks what the gate needs (a listener that waits killably once the notification is read:
/// Linux 5.19, which also has `SECCOMP_IOCTL_NOTIF_ADDFD` and `openat2`). Allocation-free
/// apart from the program, which the caller builds before fork.
pub fn install_gate(
    prog: &[libc::sock_filter],
) -> Result<Option<std::os::fd::OwnedFd>, SeccompError> {
    use std::os::fd::FromRawFd;
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_ptr() as *mut libc::sock_filter,
    };
    let flags =
        libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV;
    // SAFETY: `fprog` points at `prog`, which outlives the call; the kernel copies the program
    // and returns a new descriptor, which we own.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            flags,
            &fprog as *const libc::sock_fprog,
        )
    };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EINVAL) => Ok(None),
            _ => Err(SeccompError::Install(e)),
        };
    }
    // SAFETY: a fresh descriptor the kernel just returned.
    Ok(Some(unsafe {
        std::os::fd::OwnedFd::from_raw_fd(fd as i32)
    }))
}

/// In the command's process, just before exec: the gate's filter `prog` installed, its listener
/// sent to the gate (corral-namegate) on `to`. On a kernel without what the gate needs, the
/// gate gets nothing (and ends), `jail` says so on stderr, and the check after the run is what
/// remains; unless the gate is `required` (no run end to check at), then that is the error.
/// The error names its step.
pub(crate) fn install_and_send(
    prog: &[libc::sock_filter],
    to: std::os::fd::RawFd,
    jail: &str,
    required: bool,
) -> Result<(), (&'static str, io::Error)> {
    let listener = match install_gate(prog) {
        Ok(l) => l,
        Err(e) => return Err(("install the name gate's filter", io::Error::other(e))),
    };
    if listener.is_none() && required {
        return Err((
            "install the name gate's filter",
            io::Error::other("this kernel lacks what the name gate needs (Linux 5.19)"),
        ));
    }
    if listener.is_none() {
        eprintln!(
            "corral: this kernel lacks what the name gate needs (Linux 5.19): git repositories \
             {jail} creates are checked when the run ends instead"
        );
    }
    corral_namegate::send_listener(to, listener.as_ref())
        .map_err(|e| ("send the name gate's listener", e))
}

/// A small interpreter for the filter, so the rules can be unit-tested without installing them.
#[cfg(test)]
fn run(prog: &[libc::sock_filter], arch: u32, nr: i64, args: [u64; 6]) -> u32 {
    let mut data = [0u8; 64];
    data[0..4].copy_from_slice(&(nr as i32).to_le_bytes());
    data[4..8].copy_from_slice(&arch.to_le_bytes());
    for (i, a) in args.iter().enumerate() {
        data[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
    }
    let mut acc = 0u32;
    let mut pc = 0usize;
    loop {
        let f = prog[pc];
        pc += 1;
        match f.code {
            c if c == BPF_LD | BPF_W | BPF_ABS => {
                let o = f.k as usize;
                acc = u32::from_le_bytes(data[o..o + 4].try_into().unwrap());
            }
            c if c == BPF_RET | BPF_K => return f.k,
            c => {
                let taken = match c & 0xf0 {
                    BPF_JEQ => acc == f.k,
                    BPF_JGE => acc >= f.k,
                    BPF_JSET => acc & f.k != 0,
                    _ => panic!("unexpected opcode {c:#x}"),
                };
                pc += if taken { f.jt } else { f.jf } as usize;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, OwnedFd};

    fn eval(nr: i64, args: [u64; 6]) -> u32 {
        run(&build_filter().unwrap(), AUDIT_ARCH_NATIVE, nr, args)
    }
    const EPERM: u32 = errno(libc::EPERM);

    #[test]
    fn ordinary_syscalls_are_allowed() {
        for nr in [
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_openat,
            libc::SYS_execve,
            libc::SYS_mmap,
        ] {
            assert_eq!(eval(nr, [0; 6]), SECCOMP_RET_ALLOW, "syscall {nr}");
        }
    }

    #[test]
    fn every_denied_syscall_gets_eperm() {
        for d in denied_syscalls() {
            assert_eq!(eval(d.nr, [0; 6]), EPERM, "{}", d.name);
        }
    }

    #[test]
    fn namespace_flags_are_denied_in_clone_and_unshare_only() {
        let sigchld = libc::SIGCHLD as u64;
        assert_eq!(
            eval(libc::SYS_clone, [sigchld, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        // CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_THREAD...: a thread.
        assert_eq!(
            eval(libc::SYS_clone, [0x003d_0f00, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            eval(libc::SYS_clone, [0x1000_0000 | sigchld, 0, 0, 0, 0, 0]),
            EPERM
        );
        // The exit signal 0x80 is not CLONE_NEWTIME for clone.
        assert_eq!(
            eval(libc::SYS_clone, [0x80, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(eval(libc::SYS_unshare, [0x80, 0, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            eval(libc::SYS_unshare, [0x0000_0400, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        ); // CLONE_FILES
        assert_eq!(eval(libc::SYS_clone3, [0; 6]), errno(libc::ENOSYS));
    }

    #[test]
    fn ioctl_compares_the_low_32_bits() {
        assert_eq!(eval(libc::SYS_ioctl, [0, 0x5412, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            eval(libc::SYS_ioctl, [0, 0xdead_0000_5412, 0, 0, 0, 0]),
            EPERM
        );
        assert_eq!(eval(libc::SYS_ioctl, [0, 0x541C, 0, 0, 0, 0]), EPERM);
        assert_eq!(eval(libc::SYS_ioctl, [0, 0x5423, 0, 0, 0, 0]), EPERM);
        assert_eq!(
            eval(libc::SYS_ioctl, [0, 0x5413, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        ); // TIOCGWINSZ
    }

    #[test]
    fn socket_families() {
        let eaf = errno(libc::EAFNOSUPPORT);
        for fam in [1u64, 2, 10] {
            assert_eq!(
                eval(libc::SYS_socket, [fam, 1, 0, 0, 0, 0]),
                SECCOMP_RET_ALLOW
            );
        }
        assert_eq!(
            eval(libc::SYS_socket, [16, 3, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(eval(libc::SYS_socket, [16, 3, 15, 0, 0, 0]), eaf); // NETLINK_KOBJECT_UEVENT
        assert_eq!(eval(libc::SYS_socket, [17, 3, 0, 0, 0, 0]), eaf); // AF_PACKET
        assert_eq!(eval(libc::SYS_socket, [40, 1, 0, 0, 0, 0]), eaf); // AF_VSOCK
        assert_eq!(eval(libc::SYS_socket, [(1 << 32) | 40, 1, 0, 0, 0, 0]), eaf);
    }

    #[test]
    fn personality() {
        assert_eq!(
            eval(libc::SYS_personality, [0xffff_ffff, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            eval(libc::SYS_personality, [0, 0, 0, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            eval(libc::SYS_personality, [0x0004_0000, 0, 0, 0, 0, 0]),
            EPERM
        );
    }

    #[test]
    fn set_id_modes_are_denied_wherever_a_mode_is_given() {
        let allow = SECCOMP_RET_ALLOW;
        for mode in [0o4755u64, 0o2755, 0o6711, 0o4000, 0xffff_0000_0000_4755] {
            assert_eq!(
                eval(libc::SYS_fchmod, [3, mode, 0, 0, 0, 0]),
                EPERM,
                "{mode:o}"
            );
            assert_eq!(eval(libc::SYS_fchmodat, [0, 0, mode, 0, 0, 0]), EPERM);
            assert_eq!(eval(SYS_FCHMODAT2, [0, 0, mode, 0, 0, 0]), EPERM);
            assert_eq!(
                eval(libc::SYS_mknodat, [0, 0, 0o100000 | mode, 0, 0, 0]),
                EPERM
            );
            // openat creating (O_CREAT, O_TMPFILE) with set-id bits.
            assert_eq!(eval(libc::SYS_openat, [0, 0, 0o101, mode, 0, 0]), EPERM);
            assert_eq!(
                eval(libc::SYS_openat, [0, 0, 0o20200002, mode, 0, 0]),
                EPERM
            );
            // Without O_CREAT/O_TMPFILE the mode is ignored by the kernel: allowed.
            assert_eq!(eval(libc::SYS_openat, [0, 0, 0o2, mode, 0, 0]), allow);
            #[cfg(target_arch = "x86_64")]
            {
                assert_eq!(eval(libc::SYS_chmod, [0, mode, 0, 0, 0, 0]), EPERM);
                assert_eq!(eval(libc::SYS_creat, [0, mode, 0, 0, 0, 0]), EPERM);
                assert_eq!(eval(libc::SYS_mknod, [0, mode, 0, 0, 0, 0]), EPERM);
                assert_eq!(eval(libc::SYS_open, [0, 0o1101, mode, 0, 0, 0]), EPERM);
                assert_eq!(eval(libc::SYS_open, [0, 0, mode, 0, 0, 0]), allow);
            }
        }
        // Ordinary modes (sticky bit included) pass.
        for mode in [0o755u64, 0o644, 0o1777, 0o777, 0] {
            assert_eq!(
                eval(libc::SYS_fchmod, [3, mode, 0, 0, 0, 0]),
                allow,
                "{mode:o}"
            );
            assert_eq!(eval(libc::SYS_fchmodat, [0, 0, mode, 0, 0, 0]), allow);
            assert_eq!(eval(libc::SYS_openat, [0, 0, 0o1101, mode, 0, 0]), allow);
        }
        // mkdir keeps no set-id bit from its mode: not filtered.
        assert_eq!(eval(libc::SYS_mkdirat, [0, 0, 0o6755, 0, 0, 0]), allow);
        assert_eq!(eval(libc::SYS_openat2, [0; 6]), errno(libc::ENOSYS));
    }

    #[test]
    fn foreign_arch_is_killed_and_x32_gets_enosys() {
        let prog = build_filter().unwrap();
        assert_eq!(run(&prog, 0x4000_0003, 1, [0; 6]), SECCOMP_RET_KILL_PROCESS); // AUDIT_ARCH_I386
        #[cfg(target_arch = "x86_64")]
        assert_eq!(
            run(&prog, AUDIT_ARCH_NATIVE, 0x4000_0000 | 165, [0; 6]),
            errno(libc::ENOSYS)
        );
    }

    /// What the OCI profile answers for one call, read as libseccomp reads it: an entry
    /// naming the syscall whose every comparison holds on the whole 64-bit argument.
    fn oci_eval(profile: &serde_json::Value, name: &str, args: [u64; 6]) -> u32 {
        let mut verdicts = Vec::new();
        for entry in profile["syscalls"].as_array().unwrap() {
            let names = entry["names"].as_array().unwrap();
            if !names.iter().any(|n| n == name) {
                continue;
            }
            let empty = Vec::new();
            let conds = entry["args"].as_array().unwrap_or(&empty);
            let mut seen = Vec::new();
            let holds = conds.iter().all(|c| {
                assert_eq!(c["op"], "SCMP_CMP_MASKED_EQ");
                let i = c["index"].as_u64().unwrap() as usize;
                assert!(!seen.contains(&i), "two comparisons of arg {i} in {entry}");
                seen.push(i);
                let mask = c["value"].as_u64().unwrap();
                assert!(
                    mask <= u64::from(u32::MAX),
                    "mask {mask:#x} reaches the high half"
                );
                args[i] & mask == c["valueTwo"].as_u64().unwrap()
            });
            if holds {
                assert_eq!(entry["action"], "SCMP_ACT_ERRNO");
                verdicts.push(errno(entry["errnoRet"].as_i64().unwrap() as i32));
            }
        }
        verdicts.dedup();
        assert!(
            verdicts.len() <= 1,
            "{name}: conflicting entries {verdicts:?}"
        );
        verdicts.first().copied().unwrap_or(SECCOMP_RET_ALLOW)
    }

    /// Values around every constant a rule tests, with and without junk in the high half.
    fn probe_values(checks: &[ArgCheck], arg: u32) -> Vec<u64> {
        let mut base: Vec<u32> = vec![0, 1, u32::MAX, 0x8000_0000, 0x7fff_ffff];
        for c in checks.iter().filter(|c| c.arg == arg) {
            match c.test {
                ArgTest::AnyBit(bits) => {
                    base.extend([bits, !bits, bits.wrapping_add(1)]);
                    base.extend((0..32).map(|i| 1u32 << i).filter(|b| bits & b != 0));
                    base.extend((0..32).map(|i| !(1u32 << i)));
                }
                ArgTest::Eq(v) => base.extend([v, v ^ 1, v.wrapping_add(1), v | 0x8000_0000]),
                ArgTest::NoneOf(vs) => {
                    for &v in vs {
                        base.extend([v, v.wrapping_sub(1), v.wrapping_add(1), v ^ 0x100]);
                    }
                }
            }
        }
        let mut out = Vec::new();
        for v in base {
            out.extend([u64::from(v), u64::from(v) | 0xdead_0000_0000_0000]);
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    #[test]
    fn the_gated_profile_is_the_whole_profile_less_what_the_gate_itself_calls() {
        let mut want = oci_profile().unwrap();
        let entries = want["syscalls"].as_array_mut().unwrap();
        for e in entries.iter_mut() {
            e["names"]
                .as_array_mut()
                .unwrap()
                .retain(|n| !GATE_NEEDS.contains(&n.as_str().unwrap()));
        }
        entries.retain(|e| !e["names"].as_array().unwrap().is_empty());
        assert_eq!(oci_profile_gated().unwrap(), want);
        // Each of them is a rule of the whole profile (so the list names real syscalls).
        for name in GATE_NEEDS {
            assert!(rules().iter().any(|r| r.syscall == *name), "{name}");
        }
    }

    #[test]
    fn the_oci_profile_and_the_bpf_agree_on_every_rule() {
        let profile = oci_profile().unwrap();
        for rule in rules() {
            let mut arg_sets: Vec<Vec<u64>> = vec![vec![0]; 6];
            for c in &rule.when {
                arg_sets[c.arg as usize] = probe_values(&rule.when, c.arg);
            }
            let mut calls = vec![[0u64; 6]];
            for (i, set) in arg_sets.iter().enumerate() {
                calls = calls
                    .iter()
                    .flat_map(|call| {
                        set.iter().map(move |&v| {
                            let mut c = *call;
                            c[i] = v;
                            c
                        })
                    })
                    .collect();
            }
            let mut refused = 0;
            for args in calls {
                let bpf = eval(rule.nr, args);
                assert_eq!(
                    oci_eval(&profile, rule.syscall, args),
                    bpf,
                    "{} {args:x?}",
                    rule.syscall
                );
                refused += usize::from(bpf != SECCOMP_RET_ALLOW);
            }
            assert!(refused > 0, "{}: no probe was refused", rule.syscall);
        }
        // Syscalls no rule names are allowed by both.
        assert_eq!(oci_eval(&profile, "read", [0; 6]), SECCOMP_RET_ALLOW);
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ALLOW");
    }

    /// With a change record, removals and mode changes are stopped too (the record keeps
    /// what they change first); without one they run as they are.
    #[test]
    fn the_recording_gate_stops_removals_and_mode_changes_too() {
        let plain = build_gate_filter().unwrap();
        let recording = build_gate_filter_with(true).unwrap();
        for nr in gate_recording() {
            assert_eq!(
                run(&recording, AUDIT_ARCH_NATIVE, nr, [0; 6]),
                libc::SECCOMP_RET_USER_NOTIF,
                "syscall {nr}"
            );
            assert_eq!(
                run(&plain, AUDIT_ARCH_NATIVE, nr, [0; 6]),
                SECCOMP_RET_ALLOW,
                "syscall {nr}"
            );
            assert!(!corral_namegate::continues(nr), "syscall {nr}");
        }
        for nr in gate_always() {
            assert_eq!(
                run(&recording, AUDIT_ARCH_NATIVE, nr, [0; 6]),
                libc::SECCOMP_RET_USER_NOTIF
            );
        }
        assert_eq!(
            run(&recording, AUDIT_ARCH_NATIVE, libc::SYS_read, [0; 6]),
            SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn the_gate_stops_every_creating_or_writing_call_and_nothing_else() {
        let prog = build_gate_filter().unwrap();
        let gate = |nr: i64, args: [u64; 6]| run(&prog, AUDIT_ARCH_NATIVE, nr, args);
        let notify = libc::SECCOMP_RET_USER_NOTIF;
        let at = libc::AT_FDCWD as u32 as u64;
        for nr in gate_always() {
            assert_eq!(gate(nr, [0; 6]), notify, "syscall {nr}");
        }
        // openat creates only with O_CREAT and writes only with O_WRONLY, O_RDWR or O_TRUNC
        // (high bits of the flags word are ignored).
        let creat = libc::O_CREAT as u64;
        for writing in [libc::O_WRONLY, libc::O_RDWR, libc::O_TRUNC] {
            assert_eq!(
                gate(libc::SYS_openat, [at, 0, writing as u64, 0, 0, 0]),
                notify
            );
        }
        assert_eq!(
            gate(
                libc::SYS_openat,
                [at, 0, creat | libc::O_WRONLY as u64, 0o644, 0, 0]
            ),
            notify
        );
        assert_eq!(
            gate(libc::SYS_openat, [at, 0, (1 << 32) | creat, 0, 0, 0]),
            notify
        );
        assert_eq!(
            gate(libc::SYS_openat, [at, 0, libc::O_RDONLY as u64, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(
            gate(
                libc::SYS_openat,
                [at, 0, (libc::O_RDONLY | libc::O_CLOEXEC) as u64, 0, 0, 0]
            ),
            SECCOMP_RET_ALLOW
        );
        #[cfg(target_arch = "x86_64")]
        {
            assert_eq!(gate(libc::SYS_open, [0, creat, 0, 0, 0, 0]), notify);
            assert_eq!(gate(libc::SYS_open, [0, 0, 0, 0, 0, 0]), SECCOMP_RET_ALLOW);
            assert_eq!(gate(libc::SYS_unlink, [0; 6]), SECCOMP_RET_ALLOW);
        }
        assert_eq!(gate(libc::SYS_unlinkat, [0; 6]), SECCOMP_RET_ALLOW);
        assert_eq!(gate(libc::SYS_write, [0; 6]), SECCOMP_RET_ALLOW);
        assert_eq!(gate(libc::SYS_umask, [0o22, 0, 0, 0, 0, 0]), notify);
        assert_eq!(gate(libc::SYS_bind, [3, 0, 0, 0, 0, 0]), notify);
        // The ioctls that make or fold names are the base filter's to refuse.
        for req in [
            BTRFS_IOC_SNAP_CREATE,
            BTRFS_IOC_SUBVOL_CREATE,
            BTRFS_IOC_SNAP_CREATE_V2,
            BTRFS_IOC_SUBVOL_CREATE_V2,
            BCH_IOCTL_SUBVOLUME_CREATE,
            FS_IOC_SETFLAGS,
            FS_IOC32_SETFLAGS,
        ] {
            assert_eq!(
                eval(libc::SYS_ioctl, [3, u64::from(req), 0, 0, 0, 0]),
                EPERM
            );
        }
        // FICLONE (same 0x94 type) stays.
        assert_eq!(
            eval(libc::SYS_ioctl, [3, 0x4004_9409, 4, 0, 0, 0]),
            SECCOMP_RET_ALLOW
        );
        assert_eq!(gate(libc::SYS_landlock_restrict_self, [0; 6]), EPERM);
        // Another architecture's numbers are the base filter's to kill.
        assert_eq!(
            run(&prog, 0x4000_0003, libc::SYS_mkdirat, [0; 6]),
            SECCOMP_RET_ALLOW
        );
    }

    #[test]
    fn none_of_covers_every_other_value() {
        let cover = complement(&[1, 2, 10, 16]);
        for v in (0u32..4096).chain([u32::MAX, 0x8000_0010, 0x1_0001]) {
            let hits = cover.iter().filter(|(m, x)| v & m == *x).count();
            let excluded = [1, 2, 10, 16].contains(&v);
            assert_eq!(hits, usize::from(!excluded), "{v:#x}");
        }
    }

    // ---- the name gate (corral-namegate) with its filter installed ----

    /// No call is let continue but umask(2): every other call the filter stops depends on a
    /// path, an address or a descriptor the jail can change after the gate looked.
    #[test]
    fn only_umask_is_let_continue() {
        let mut stopped = gate_always();
        stopped.extend([libc::SYS_openat, libc::SYS_bind, libc::SYS_umask]);
        #[cfg(target_arch = "x86_64")]
        stopped.push(libc::SYS_open);
        for nr in stopped {
            assert_eq!(
                corral_namegate::continues(nr),
                nr == libc::SYS_umask,
                "syscall {nr}"
            );
        }
        // (The filter stops bind(2) whatever its arguments: seccomp.rs's
        // the_gate_stops_every_creating_or_writing_call_and_nothing_else.)
    }

    /// Once no process holds the gate's filter, its workers end, both of them (on Linux 6.11+ every RECV
    /// then fails at once with ENOENT: a worker that took that for one caller's death spun on
    /// it until PID 1 exited, on a CPU the jail's end needed; before, the RECV blocked).
    #[test]
    fn the_worker_ends_once_no_process_holds_the_filter() {
        let prog = build_gate_filter().unwrap();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let (ours, theirs) = (OwnedFd::from(ours), OwnedFd::from(theirs));
        // SAFETY: the child makes syscalls, allocates (glibc's malloc is usable after fork),
        // and leaves with _exit.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", io::Error::last_os_error());
        if pid == 0 {
            // SAFETY: prctl with integer arguments; the child's own filter.
            unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
            let code = match install_gate(&prog) {
                Ok(listener) => {
                    match corral_namegate::send_listener(theirs.as_raw_fd(), listener.as_ref()) {
                        Ok(()) => 0,
                        Err(_) => 2,
                    }
                }
                Err(_) => 1,
            };
            // SAFETY: the forked child ends here.
            unsafe { libc::_exit(code) };
        }
        drop(theirs);
        let listener = corral_namegate::receive_listener(&ours);
        let mut status = 0;
        // SAFETY: our own child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "the child could not install the gate's filter or send its listener: {status:#x}"
        );
        let Some(listener) = listener else {
            eprintln!("skipping: this kernel lacks what the name gate needs (Linux 5.19)");
            return;
        };
        let gate = corral_namegate::Gate::new(&[], Default::default(), b"").unwrap();
        let (done, ended) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            gate.work(listener);
            let _ = done.send(());
        });
        assert!(
            ended
                .recv_timeout(std::time::Duration::from_secs(20))
                .is_ok(),
            "the gate's worker still runs with no process left under its filter"
        );
    }
}
