//! The locked-memory limit that RDMA registrations count against.
//!
//! `ibv_reg_mr` pins the pages it registers, and the kernel counts them against the process's
//! `RLIMIT_MEMLOCK` unless it holds `CAP_IPC_LOCK`. Under a common limit (8 MiB, 64 KiB on older
//! distributions) or in a container without the capability, a bandwidth test's buffers do not fit
//! and `ibv_reg_mr` fails with a bare "Cannot allocate memory". [`check`] says beforehand, with
//! the numbers and the fix.

use std::fmt;

/// `CAP_IPC_LOCK`'s bit in the capability sets.
const CAP_IPC_LOCK: u32 = 14;

/// What limits this process's locked memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemlockLimit {
    /// The soft `RLIMIT_MEMLOCK`, bytes; `None` for unlimited.
    pub soft: Option<u64>,
    /// Whether the process holds `CAP_IPC_LOCK` (the limit then does not apply).
    pub cap_ipc_lock: bool,
}

/// Registrations would pass the locked-memory limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemlockError {
    /// Bytes the registrations need, with what is already registered.
    pub need: u64,
    /// The limit, bytes.
    pub limit: u64,
}

fn mib(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
    } else {
        format!("{} KiB", b / 1024)
    }
}

impl fmt::Display for MemlockError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the buffers need {} of locked memory and this process may lock {} \
             (RLIMIT_MEMLOCK, `ulimit -l` says {} KiB): raise it with `ulimit -l unlimited` (a \
             `memlock` line in /etc/security/limits.conf, `LimitMEMLOCK=infinity` for a systemd \
             unit, `--ulimit memlock=-1` for a container), or use smaller messages (-s), fewer \
             connections (-q) or fewer iterations (-n)",
            mib(self.need),
            mib(self.limit),
            self.limit / 1024
        )
    }
}

impl std::error::Error for MemlockError {}

impl MemlockLimit {
    /// This process's limit and capability, read from the kernel.
    pub fn current() -> MemlockLimit {
        let mut r = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `r` is a live out-parameter of the right type.
        let ok = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) } == 0;
        let soft = if !ok || r.rlim_cur == libc::RLIM_INFINITY {
            None
        } else {
            Some(r.rlim_cur)
        };
        MemlockLimit {
            soft,
            cap_ipc_lock: effective_caps().is_some_and(|c| c >> CAP_IPC_LOCK & 1 == 1),
        }
    }

    /// Whether `need` bytes of registrations in all fit.
    pub fn check(&self, need: u64) -> Result<(), MemlockError> {
        match self.soft {
            Some(limit) if !self.cap_ipc_lock && need > limit => Err(MemlockError { need, limit }),
            _ => Ok(()),
        }
    }
}

/// The effective capability set (`CapEff` of /proc/self/status).
fn effective_caps() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("CapEff:"))?;
    u64::from_str_radix(line["CapEff:".len()..].trim(), 16).ok()
}

/// Bytes this process has pinned (`VmPin` of /proc/self/status: the pages RDMA registrations
/// hold, which the kernel counts against `RLIMIT_MEMLOCK`); 0 where the kernel does not say.
pub fn pinned_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmPin:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether `need` bytes of registrations fit this process's locked-memory limit.
pub fn check(need: u64) -> Result<(), MemlockError> {
    MemlockLimit::current().check(need)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_applies_only_without_the_capability() {
        let eight = 8 << 20;
        let lim = MemlockLimit {
            soft: Some(eight),
            cap_ipc_lock: false,
        };
        assert_eq!(lim.check(eight), Ok(()));
        let e = lim.check(128 << 20).unwrap_err();
        assert_eq!((e.need, e.limit), (128 << 20, eight));
        let msg = e.to_string();
        for part in [
            "128.0 MiB",
            "8.0 MiB",
            "8192 KiB",
            "ulimit -l unlimited",
            "memlock=-1",
        ] {
            assert!(msg.contains(part), "{part:?} in {msg}");
        }
        let cap = MemlockLimit {
            cap_ipc_lock: true,
            ..lim
        };
        assert_eq!(cap.check(u64::MAX), Ok(()));
        let unlimited = MemlockLimit {
            soft: None,
            cap_ipc_lock: false,
        };
        assert_eq!(unlimited.check(u64::MAX), Ok(()));
        // Nothing is pinned by a test process (no RDMA registration here).
        assert_eq!(pinned_bytes(), 0);
    }

    /// Under a lowered limit and without CAP_IPC_LOCK (set by `setpriv` and `prlimit` for a
    /// child run of this test binary), the check reads both from the kernel and refuses with the
    /// numbers. The child is this same test, told by an environment variable which side it is.
    #[test]
    #[cfg_attr(
        not(target_arch = "x86_64"),
        ignore = "execs this test binary again through setpriv and prlimit: under qemu-user (the \
                  aarch64 run) that needs binfmt_misc; on a native Arm host run it with --include-ignored"
    )]
    fn a_lowered_limit_is_read_and_refused() {
        if std::env::var_os("METAROCE_MEMLOCK_CHILD").is_some() {
            let lim = MemlockLimit::current();
            assert_eq!(lim.soft, Some(1 << 20), "{lim:?}");
            assert!(!lim.cap_ipc_lock, "{lim:?}");
            let e = check(128 << 20).unwrap_err();
            assert!(e.to_string().contains("may lock 1.0 MiB"), "{e}");
            assert_eq!(check(512 << 10), Ok(()));
            return;
        }
        let exe = std::env::current_exe().unwrap();
        let prlimit = ["prlimit", "--memlock=1048576:1048576"];
        // SAFETY: getuid has no preconditions.
        let mut cmd = if unsafe { libc::getuid() } == 0 {
            // root holds CAP_IPC_LOCK: drop it for the child.
            let mut c = std::process::Command::new("setpriv");
            c.args([
                "--inh-caps=-ipc_lock",
                "--ambient-caps=-ipc_lock",
                "--bounding-set=-ipc_lock",
            ])
            .args(prlimit);
            c
        } else {
            let mut c = std::process::Command::new(prlimit[0]);
            c.arg(prlimit[1]);
            c
        };
        let out = cmd
            .arg(&exe)
            .args([
                "memlock::tests::a_lowered_limit_is_read_and_refused",
                "--exact",
                "--test-threads=1",
            ])
            .env("METAROCE_MEMLOCK_CHILD", "1")
            .output()
            .expect("setpriv and prlimit (util-linux) run");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(text.contains("1 passed"), "the child ran the test: {text}");
    }
}
