//! The receiver's fair share across engines on one host: every engine with a line rate (a server
//! process, or each worker thread of one) publishes what its senders want in a slot of a small
//! table in shared memory (a file, by default under `/dev/shm`, mapped by every engine that names
//! it) and reads the others', so that the line is divided among all the connections arriving over
//! it, not given whole to each process's.
//!
//! Layout: a header (magic, version, slot count), then [`SLOTS`] slots of 64 bytes, every field a
//! 64-bit word read and written atomically: the owner (process id and an engine number, 0 for
//! free), the owner's last update (`CLOCK_MONOTONIC` ns, the same clock in every process), the
//! key (the line rate and the local address: only engines that receive on the same address at
//! the same line rate share it), how many of its senders want all they can get, and what the
//! others want together (Mb/s). A slot not updated for [`STALE_NS`] is free to take and counts for
//! nothing (an engine that ended without clearing it). Nothing else is shared: no lock, no
//! pointer, nothing a peer's bytes can reach.

use std::fs::OpenOptions;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// Slots in a table: engines that can share one line.
pub const SLOTS: usize = 64;
/// A slot not updated for this long counts for nothing and may be taken. ns.
pub const STALE_NS: u64 = 50_000_000;

const MAGIC: u64 = 0x4d52_4f43_4553_4852; // "MROCESHR"
const VERSION: u64 = 1;
const HEADER_WORDS: usize = 8;
const SLOT_WORDS: usize = 8;
const BYTES: usize = (HEADER_WORDS + SLOTS * SLOT_WORDS) * 8;

// Word offsets in a slot.
const OWNER: usize = 0;
const UPDATED: usize = 1;
const KEY_RATE: usize = 2;
const KEY_HI: usize = 3;
const KEY_LO: usize = 4;
const UNBOUNDED: usize = 5;
const BOUNDED: usize = 6;

/// Engines numbered within this process (with the process id, a slot's owner).
static ENGINES: AtomicU32 = AtomicU32::new(1);

/// The default table of this user: `/dev/shm/metaroce-fair-share-<uid>`.
pub fn default_path() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/dev/shm/metaroce-fair-share-{uid}"))
}

/// `CLOCK_MONOTONIC`, ns: the same clock in every process of the host.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write; CLOCK_MONOTONIC is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// This engine's slot in a host's table.
pub struct ShareTable {
    base: *mut AtomicU64,
    slot: usize,
    owner: u64,
    key: [u64; 3],
    path: PathBuf,
}

impl std::fmt::Debug for ShareTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShareTable")
            .field("path", &self.path)
            .field("slot", &self.slot)
            .finish()
    }
}

impl ShareTable {
    /// Maps the table at `path` (made if missing, mode 0600) and takes a free slot for an engine
    /// receiving on `local_ip` at `line_rate_mbps`. None, with the reason, when the file cannot
    /// be made or mapped, holds something else, or every slot is taken.
    pub fn open(path: &Path, local_ip: IpAddr, line_rate_mbps: u32) -> Result<Self, String> {
        use std::os::unix::fs::OpenOptionsExt;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let len = f
            .metadata()
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len < BYTES as u64 {
            f.set_len(BYTES as u64)
                .map_err(|e| format!("{}: {e}", path.display()))?;
        }
        // SAFETY: a shared read-write mapping of BYTES bytes of a file at least that long (set
        // above); the result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "{}: mmap: {}",
                path.display(),
                std::io::Error::last_os_error()
            ));
        }
        let base = p.cast::<AtomicU64>();
        let ip = match local_ip {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        let key = [
            u64::from(line_rate_mbps),
            u64::from_be_bytes(ip[..8].try_into().unwrap_or_default()),
            u64::from_be_bytes(ip[8..].try_into().unwrap_or_default()),
        ];
        let owner = (u64::from(std::process::id()) << 32)
            | u64::from(ENGINES.fetch_add(1, Ordering::Relaxed));
        let mut t = ShareTable {
            base,
            slot: usize::MAX,
            owner,
            key,
            path: path.to_path_buf(),
        };
        // A new file is all zeros: stamp it; a file that holds something else is refused.
        let magic = t.word(0);
        if magic
            .compare_exchange(0, MAGIC, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            t.word(1).store(VERSION, Ordering::Release);
            t.word(2).store(SLOTS as u64, Ordering::Release);
        } else if magic.load(Ordering::Acquire) != MAGIC
            || t.word(1).load(Ordering::Acquire) != VERSION
            || t.word(2).load(Ordering::Acquire) != SLOTS as u64
        {
            return Err(format!("{}: not a fair-share table", path.display()));
        }
        let now = monotonic_ns();
        for i in 0..SLOTS {
            let o = t.slot_word(i, OWNER);
            let seen = o.load(Ordering::Acquire);
            let fresh =
                now.saturating_sub(t.slot_word(i, UPDATED).load(Ordering::Acquire)) < STALE_NS;
            if seen != 0 && fresh {
                continue;
            }
            if o.compare_exchange(seen, owner, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                t.slot = i;
                for (w, v) in [(KEY_RATE, key[0]), (KEY_HI, key[1]), (KEY_LO, key[2])] {
                    t.slot_word(i, w).store(v, Ordering::Release);
                }
                t.slot_word(i, UNBOUNDED).store(0, Ordering::Release);
                t.slot_word(i, BOUNDED).store(0, Ordering::Release);
                t.slot_word(i, UPDATED).store(now, Ordering::Release);
                return Ok(t);
            }
        }
        Err(format!("{}: all {SLOTS} slots are taken", path.display()))
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < BYTES / 8);
        // SAFETY: `base` is a live mapping of BYTES bytes (page-aligned, so every word is
        // aligned) for as long as `self`; `i` is in range (asserted); AtomicU64 has u64's layout
        // and the words are only ever accessed atomically, by every process that maps them.
        unsafe { &*self.base.add(i) }
    }

    fn slot_word(&self, slot: usize, w: usize) -> &AtomicU64 {
        self.word(HEADER_WORDS + slot * SLOT_WORDS + w)
    }

    /// Publishes what this engine's senders want (`unbounded` of them all they can get, the
    /// rest `bounded_mbps` together) and returns the same of every other fresh engine sharing
    /// this one's key.
    pub fn exchange(&self, unbounded: u32, bounded_mbps: u64) -> (u32, u64) {
        let now = monotonic_ns();
        if self.slot_word(self.slot, OWNER).load(Ordering::Acquire) != self.owner {
            // Taken over (this engine stalled for longer than STALE_NS): take a slot again next
            // time the engine opens one; until then count the others only.
            return self.others(now);
        }
        self.slot_word(self.slot, UNBOUNDED)
            .store(u64::from(unbounded), Ordering::Release);
        self.slot_word(self.slot, BOUNDED)
            .store(bounded_mbps, Ordering::Release);
        self.slot_word(self.slot, UPDATED)
            .store(now, Ordering::Release);
        self.others(now)
    }

    fn others(&self, now: u64) -> (u32, u64) {
        let (mut unbounded, mut bounded) = (0u32, 0u64);
        for i in (0..SLOTS).filter(|&i| i != self.slot) {
            if self.slot_word(i, OWNER).load(Ordering::Acquire) == 0 {
                continue;
            }
            let updated = self.slot_word(i, UPDATED).load(Ordering::Acquire);
            if now.saturating_sub(updated) >= STALE_NS {
                continue;
            }
            let same = [(KEY_RATE, 0), (KEY_HI, 1), (KEY_LO, 2)]
                .iter()
                .all(|&(w, k)| self.slot_word(i, w).load(Ordering::Acquire) == self.key[k]);
            if same {
                let u = self.slot_word(i, UNBOUNDED).load(Ordering::Acquire);
                unbounded = unbounded.saturating_add(u.min(u64::from(u32::MAX)) as u32);
                bounded =
                    bounded.saturating_add(self.slot_word(i, BOUNDED).load(Ordering::Acquire));
            }
        }
        (unbounded, bounded)
    }

    /// The table's file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ShareTable {
    fn drop(&mut self) {
        if self.slot < SLOTS {
            let _ = self.slot_word(self.slot, OWNER).compare_exchange(
                self.owner,
                0,
                Ordering::AcqRel,
                Ordering::Acquire,
            );
        }
        // SAFETY: `base` is the mapping of BYTES bytes made in `open`, unmapped once, here.
        unsafe { libc::munmap(self.base.cast(), BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("metaroce-share-{}-{name}", std::process::id()))
    }

    #[test]
    fn engines_on_one_line_see_each_other_and_only_those() {
        let path = temp("see");
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let a = ShareTable::open(&path, ip, 1_000).unwrap();
        let b = ShareTable::open(&path, ip, 1_000).unwrap();
        // Another address, or another line rate: another line.
        let c = ShareTable::open(&path, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)), 1_000).unwrap();
        let d = ShareTable::open(&path, ip, 2_000).unwrap();
        assert_ne!(a.slot, b.slot);
        assert_eq!(a.exchange(1, 0), (0, 0));
        assert_eq!(c.exchange(5, 0), (0, 0));
        assert_eq!(d.exchange(7, 70), (0, 0));
        assert_eq!(b.exchange(2, 300), (1, 0));
        assert_eq!(a.exchange(1, 0), (2, 300));
        // An engine that ends gives its slot back and counts no more.
        drop(b);
        assert_eq!(a.exchange(1, 0), (0, 0));
        let e = ShareTable::open(&path, ip, 1_000).unwrap();
        assert_eq!(e.exchange(3, 0), (1, 0));
        drop((a, c, d, e));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_that_is_not_a_table_is_refused() {
        let path = temp("foreign");
        std::fs::write(&path, vec![0xabu8; BYTES]).unwrap();
        let e = ShareTable::open(&path, IpAddr::V4(Ipv4Addr::LOCALHOST), 1_000).unwrap_err();
        assert!(e.contains("not a fair-share table"), "{e}");
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_full_table_says_so() {
        let path = temp("full");
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let all: Vec<ShareTable> = (0..SLOTS)
            .map(|_| ShareTable::open(&path, ip, 1_000).unwrap())
            .collect();
        let e = ShareTable::open(&path, ip, 1_000).unwrap_err();
        assert!(e.contains("slots are taken"), "{e}");
        drop(all);
        assert!(ShareTable::open(&path, ip, 1_000).is_ok());
        let _ = std::fs::remove_file(&path);
    }
}
