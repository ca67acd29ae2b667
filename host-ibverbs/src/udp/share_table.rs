//! The receiver's fair share across engines on one host: every engine with a line rate (a server
//! process, or each worker thread of one) publishes what its senders want in a slot of a small
//! table in shared memory (a file, by default under `/dev/shm`, mapped by every engine that names
//! it) and reads the others', so that the line is divided among all the connections arriving over
//! it, not given whole to each process's.
//!
//! Layout: one header word (magic, version and slot count together, written once by a single
//! compare-and-swap), then [`SLOTS`] slots of eight 64-bit words, each read and written
//! atomically: the owner (a random token), the owner's last update (`CLOCK_MONOTONIC` ns, the same
//! clock in every process), the key (the line rate and the local address: only engines that
//! receive on the same address at the same line rate share it), how many of its senders want all
//! they can get, what the others want together (Mb/s), and until when that holds. A slot not
//! updated for [`STALE_NS`] (or dated in the future) is free to take and counts for nothing; a
//! slot past its "until" counts for nothing. Nothing else is shared: no lock, no pointer, nothing a
//! peer's bytes can reach. The file must be a regular file of this user with no access for others
//! (it is made so); a file that is not, or that holds something else, is refused.

use std::fs::OpenOptions;
use std::net::IpAddr;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Slots in a table: engines that can share one line.
pub const SLOTS: usize = 64;
/// A slot not updated for this long counts for nothing and may be taken. ns.
pub const STALE_NS: u64 = 50_000_000;

/// "MROCSHR", version 1, 64 slots: the header's one word.
const HEADER: u64 = 0x4d52_4f43_5348_0140;
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
const UNTIL: usize = 7;

/// The default table of this user: `/dev/shm/metaroce-fair-share-<uid>`.
pub fn default_path() -> PathBuf {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
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

/// Whether a slot updated at `updated` is fresh at `now` (a date in the future, a corrupt word
/// or a file that outlived a reboot, is not).
fn fresh(updated: u64, now: u64) -> bool {
    updated <= now.saturating_add(STALE_NS) && now.saturating_sub(updated) < STALE_NS
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
    /// receiving on `local_ip` at `line_rate_mbps`. An error, with the reason, when the file
    /// cannot be made or mapped, is not a private regular file of this user, holds something
    /// else, or every slot is taken.
    pub fn open(path: &Path, local_ip: IpAddr, line_rate_mbps: u32) -> Result<Self, String> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let err = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(path)
            .map_err(|e| err(&e))?;
        let meta = f.metadata().map_err(|e| err(&e))?;
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        if !meta.file_type().is_file() || meta.uid() != me || meta.mode() & 0o077 != 0 {
            return Err(err(&"not a private regular file of this user"));
        }
        if meta.len() < BYTES as u64 {
            f.set_len(BYTES as u64).map_err(|e| err(&e))?;
        }
        // Blocks for the whole table now, so that a full tmpfs is an error here and not a
        // SIGBUS at the first store.
        // SAFETY: a valid open descriptor and a range within the file's length.
        let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, BYTES as libc::off_t) };
        if r != 0 {
            return Err(err(&std::io::Error::from_raw_os_error(r)));
        }
        // SAFETY: a shared read-write mapping of BYTES bytes of a file at least that long (set
        // and allocated above); the result is checked before use.
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
            return Err(err(&format!("mmap: {}", std::io::Error::last_os_error())));
        }
        let ip = match local_ip {
            IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
            IpAddr::V6(a) => a.octets(),
        };
        let key = [
            u64::from(line_rate_mbps),
            u64::from_be_bytes(ip[..8].try_into().unwrap_or_default()),
            u64::from_be_bytes(ip[8..].try_into().unwrap_or_default()),
        ];
        let mut t = ShareTable {
            base: p.cast::<AtomicU64>(),
            slot: usize::MAX,
            owner: super::random_seed() | 1,
            key,
            path: path.to_path_buf(),
        };
        // A new file is all zeros: stamp it in one word; a file that holds something else is
        // refused.
        let header = t.word(0);
        if let Err(seen) = header.compare_exchange(0, HEADER, Ordering::AcqRel, Ordering::Acquire) {
            if seen != HEADER {
                return Err(err(&"not a fair-share table"));
            }
        }
        if !t.claim() {
            return Err(err(&format!("all {SLOTS} slots are taken")));
        }
        Ok(t)
    }

    /// Takes a slot that is free or stale: first its date (a compare-and-swap from the stale
    /// date seen, so that two engines cannot both take it), then its owner and key.
    fn claim(&mut self) -> bool {
        let now = monotonic_ns();
        for i in 0..SLOTS {
            let updated = self.slot_word(i, UPDATED);
            let seen = updated.load(Ordering::Acquire);
            if fresh(seen, now) {
                continue;
            }
            if updated
                .compare_exchange(seen, now, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                self.slot = i;
                self.slot_word(i, OWNER)
                    .store(self.owner, Ordering::Release);
                self.write(0, 0, 0, now);
                return true;
            }
        }
        self.slot = usize::MAX;
        false
    }

    /// Writes this engine's slot: its key, its senders, until when they hold, and the date.
    fn write(&self, unbounded: u32, bounded_mbps: u64, until: u64, now: u64) {
        let i = self.slot;
        for (w, v) in [
            (KEY_RATE, self.key[0]),
            (KEY_HI, self.key[1]),
            (KEY_LO, self.key[2]),
            (UNBOUNDED, u64::from(unbounded)),
            (BOUNDED, bounded_mbps),
            (UNTIL, until),
        ] {
            self.slot_word(i, w).store(v, Ordering::Release);
        }
        self.slot_word(i, UPDATED).store(now, Ordering::Release);
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < BYTES / 8);
        // SAFETY: `base` is a live mapping of BYTES bytes (page-aligned, so every word is
        // aligned) for as long as `self`; `i` is in range (asserted); AtomicU64 has u64's layout.
        // This process only ever reads and writes the words atomically; another process of the
        // same user could write the file otherwise, which can make the values wrong (they are
        // bounded where they are used) but not this access unsound.
        unsafe { &*self.base.add(i) }
    }

    fn slot_word(&self, slot: usize, w: usize) -> &AtomicU64 {
        self.word(HEADER_WORDS + slot * SLOT_WORDS + w)
    }

    /// Publishes what this engine's senders want (`unbounded` of them all they can get, the
    /// rest `bounded_mbps` together), valid for `valid_ns` unless published again, and returns
    /// the same of every other engine sharing this one's key whose publication holds. An engine
    /// that lost its slot (it stalled for longer than [`STALE_NS`] and another took it) takes
    /// a slot again; with none free it counts the others only.
    pub fn exchange(&mut self, unbounded: u32, bounded_mbps: u64, valid_ns: u64) -> (u32, u64) {
        let now = monotonic_ns();
        let mine = self.slot < SLOTS
            && self.slot_word(self.slot, OWNER).load(Ordering::Acquire) == self.owner;
        if mine || self.claim() {
            self.write(unbounded, bounded_mbps, now.saturating_add(valid_ns), now);
        }
        self.others(now)
    }

    fn others(&self, now: u64) -> (u32, u64) {
        let (mut unbounded, mut bounded) = (0u32, 0u64);
        for i in 0..SLOTS {
            let owner = self.slot_word(i, OWNER).load(Ordering::Acquire);
            if owner == 0 || owner == self.owner {
                continue;
            }
            let updated = self.slot_word(i, UPDATED).load(Ordering::Acquire);
            let until = self.slot_word(i, UNTIL).load(Ordering::Acquire);
            if !fresh(updated, now) || now >= until {
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
        if self.slot < SLOTS
            && self.slot_word(self.slot, OWNER).load(Ordering::Acquire) == self.owner
        {
            // Free at once: no date, no owner.
            self.slot_word(self.slot, UPDATED)
                .store(0, Ordering::Release);
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

    const SECOND: u64 = 1_000_000_000;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("metaroce-share-{}-{name}", std::process::id()))
    }

    #[test]
    fn engines_on_one_line_see_each_other_and_only_those() {
        let path = temp("see");
        let ip = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));
        let mut a = ShareTable::open(&path, ip, 1_000).unwrap();
        let mut b = ShareTable::open(&path, ip, 1_000).unwrap();
        // Another address, or another line rate: another line.
        let mut c = ShareTable::open(&path, IpAddr::V4(Ipv4Addr::new(10, 0, 0, 3)), 1_000).unwrap();
        let mut d = ShareTable::open(&path, ip, 2_000).unwrap();
        assert_ne!(a.slot, b.slot);
        assert_eq!(a.exchange(1, 0, SECOND), (0, 0));
        assert_eq!(c.exchange(5, 0, SECOND), (0, 0));
        assert_eq!(d.exchange(7, 70, SECOND), (0, 0));
        assert_eq!(b.exchange(2, 300, SECOND), (1, 0));
        assert_eq!(a.exchange(1, 0, SECOND), (2, 300));
        // An engine that ends gives its slot back and counts no more.
        drop(b);
        assert_eq!(a.exchange(1, 0, SECOND), (0, 0));
        let mut e = ShareTable::open(&path, ip, 1_000).unwrap();
        assert_eq!(e.exchange(3, 0, SECOND), (1, 0));
        drop((a, c, d, e));
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_file_that_is_not_a_private_table_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let path = temp("foreign");
        std::fs::write(&path, vec![0xabu8; BYTES]).unwrap();
        // Readable by others: refused whatever it holds.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = ShareTable::open(&path, ip, 1_000).unwrap_err();
        assert!(e.contains("not a private regular file"), "{e}");
        // Private, but something else.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let e = ShareTable::open(&path, ip, 1_000).unwrap_err();
        assert!(e.contains("not a fair-share table"), "{e}");
        // A symbolic link is not followed.
        let link = temp("link");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(ShareTable::open(&link, ip, 1_000).is_err());
        let _ = std::fs::remove_file(&link);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_publication_holds_for_its_time_and_a_lost_slot_is_taken_again() {
        let path = temp("until");
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let mut a = ShareTable::open(&path, ip, 1_000).unwrap();
        let mut b = ShareTable::open(&path, ip, 1_000).unwrap();
        // A's senders hold for 1 ms only: after it, B counts none of them.
        assert_eq!(a.exchange(4, 0, 1_000_000), (0, 0));
        assert_eq!(b.exchange(1, 0, SECOND), (4, 0));
        std::thread::sleep(std::time::Duration::from_millis(3));
        assert_eq!(b.exchange(1, 0, SECOND), (0, 0));
        // Another engine takes A's slot (as if A had stalled past STALE_NS): A takes another
        // at its next exchange, and neither counts the other's slot as its own.
        let taken = a.slot;
        a.slot_word(taken, UPDATED).store(0, Ordering::Release);
        let mut c = ShareTable::open(&path, ip, 1_000).unwrap();
        assert_eq!(c.slot, taken);
        assert_eq!(c.exchange(2, 0, SECOND), (1, 0));
        assert_eq!(a.exchange(3, 0, SECOND), (3, 0));
        assert_ne!(a.slot, taken);
        assert_eq!(b.exchange(1, 0, SECOND), (5, 0));
        drop((a, b, c));
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
