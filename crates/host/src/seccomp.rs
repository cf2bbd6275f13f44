//! The system calls a sandbox's processes (its server, `airlock exec` code, a
//! promotion's build) may not make: a seccomp filter installed between fork and
//! exec, after the process has become its unprivileged user, with
//! `no_new_privs` set so no setuid program can give back what was dropped.
//!
//! Refused with EPERM: every Btrfs ioctl (a user who can write a directory on a
//! Btrfs volume may otherwise make a subvolume there, outside its quota, or mark
//! one read-only so that nobody can remove it); new namespaces of any kind,
//! including user namespaces, and joining or mounting; tracing other processes
//! and reading their memory; BPF, perf events, userfaultfd, io_uring, kernel
//! keys and modules. Clone3 answers ENOSYS, so the C library falls back to clone,
//! whose flags can be checked. Nothing a PostgreSQL server or ordinary agent code
//! needs is among them; what is left is the kernel's ordinary surface.
//! System calls of another architecture's ABI (32-bit calls from a 64-bit
//! process) are refused outright, so no second table can be used around this one.

use std::sync::OnceLock;

use nix::libc;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;
/// x32 system calls on x86_64 carry this bit in their number.
const X32_BIT: u32 = 0x4000_0000;

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JSET_K: u16 = 0x45;
const RSH_K: u16 = 0x74;
const AND_K: u16 = 0x54;
const RET_K: u16 = 0x06;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;

/// Offsets in `struct seccomp_data`.
const NR: u32 = 0;
const ARCH: u32 = 4;
const ARG0_LOW: u32 = 16;
const ARG1_LOW: u32 = 24;

/// The ioctl type byte of every Btrfs ioctl (`BTRFS_IOCTL_MAGIC`).
const BTRFS_IOCTL: u32 = 0x94;

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// System calls refused outright.
fn refused() -> Vec<u32> {
    let calls = [
        libc::SYS_unshare,
        libc::SYS_setns,
        libc::SYS_mount,
        libc::SYS_umount2,
        libc::SYS_pivot_root,
        libc::SYS_bpf,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
        libc::SYS_ptrace,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_open_by_handle_at,
        libc::SYS_name_to_handle_at,
        libc::SYS_io_uring_setup,
        libc::SYS_io_uring_enter,
        libc::SYS_io_uring_register,
        libc::SYS_open_tree,
        libc::SYS_move_mount,
        libc::SYS_fsopen,
        libc::SYS_fsconfig,
        libc::SYS_fsmount,
        libc::SYS_fspick,
        libc::SYS_mount_setattr,
    ];
    calls.into_iter().map(|c| c as u32).collect()
}

/// The filter program, built once (before any fork that installs it).
pub fn program() -> &'static [libc::sock_filter] {
    static PROGRAM: OnceLock<Vec<libc::sock_filter>> = OnceLock::new();
    PROGRAM.get_or_init(|| {
        let deny = op(RET_K, 0, 0, RET_ERRNO | libc::EPERM as u32);
        let allow = op(RET_K, 0, 0, RET_ALLOW);
        let mut p = vec![
            op(LD_W_ABS, 0, 0, ARCH),
            // Another ABI's call: refused.
            op(JEQ_K, 1, 0, AUDIT_ARCH),
            deny,
            op(LD_W_ABS, 0, 0, NR),
            op(JSET_K, 0, 1, X32_BIT),
            deny,
        ];
        for nr in refused() {
            p.push(op(JEQ_K, 0, 1, nr));
            p.push(deny);
        }
        p.push(op(JEQ_K, 0, 1, libc::SYS_clone3 as u32));
        p.push(op(RET_K, 0, 0, RET_ERRNO | libc::ENOSYS as u32));
        // clone(flags, ...): no new namespace of any kind.
        let namespaces = (libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWNET
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS
            | libc::CLONE_NEWCGROUP) as u32;
        p.extend([
            op(JEQ_K, 0, 4, libc::SYS_clone as u32),
            op(LD_W_ABS, 0, 0, ARG0_LOW),
            op(JSET_K, 1, 0, namespaces),
            allow,
            deny,
        ]);
        // ioctl(fd, request, ...): no Btrfs request.
        p.extend([
            op(JEQ_K, 0, 5, libc::SYS_ioctl as u32),
            op(LD_W_ABS, 0, 0, ARG1_LOW),
            op(RSH_K, 0, 0, 8),
            op(AND_K, 0, 0, 0xff),
            op(JEQ_K, 0, 1, BTRFS_IOCTL),
            deny,
            allow,
        ]);
        p
    })
}

/// In a child between fork and exec, after it dropped to its user: sets
/// `no_new_privs` and installs the filter. Only async-signal-safe system calls
/// (the program was built before the fork).
pub fn confine(program: &'static [libc::sock_filter]) -> std::io::Result<()> {
    // SAFETY: prctl with documented arguments; the program outlives the process's
    // use of it (the kernel copies it).
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let prog = libc::sock_fprog { len: program.len() as u16, filter: program.as_ptr() as *mut _ };
        if libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
