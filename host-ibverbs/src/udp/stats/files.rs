//! The snapshots of running endpoints on disk.
//!
//! They live in a directory of the user's own ([`run_dir`]). Under `/tmp` another local user
//! could create that directory first and plant links in it, so every use checks it (a directory,
//! not a link, ours, mode without group or other bits), files are created new with
//! `O_EXCL | O_NOFOLLOW` and mode 0600, and `metaroce stats` reads only our regular files of
//! bounded size.

use serde_json::Value;
use std::fmt;
use std::fs;
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The largest snapshot `metaroce stats` reads. A snapshot takes a few kilobytes per queue pair,
/// so a larger file is not one a running endpoint wrote, and reading it whole could exhaust memory.
pub const MAX_SNAPSHOT_BYTES: u64 = 1 << 20;

/// Fresh temporary names a publication tries before it gives up. Only a crashed process of the
/// same pid (or the user) can leave names behind in the private directory, so a few suffice.
const TEMP_ATTEMPTS: u32 = 16;

/// Why the stats directory was refused or could not be used. Every variant names the path.
#[derive(Debug)]
pub enum StatsError {
    /// The path exists and is neither a directory nor a link to one.
    NotADirectory(PathBuf),
    /// The path is a symbolic link: whoever made it chooses where the snapshots would go.
    Symlink(PathBuf),
    /// The directory belongs to another user, who could plant links in it.
    WrongOwner {
        /// The directory.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// This process's effective user id, the owner required.
        euid: u32,
    },
    /// Group or other users have permissions on the directory.
    TooOpen {
        /// The directory.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A system call on the directory or a file in it failed.
    Io {
        /// What was being done ("cannot create", ...).
        what: &'static str,
        /// The directory or file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
}

impl fmt::Display for StatsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StatsError::NotADirectory(p) => {
                write!(
                    f,
                    "refusing the stats directory {}: not a directory",
                    p.display()
                )
            }
            StatsError::Symlink(p) => {
                write!(
                    f,
                    "refusing the stats directory {}: a symbolic link",
                    p.display()
                )
            }
            StatsError::WrongOwner { path, uid, euid } => write!(
                f,
                "refusing the stats directory {}: owned by uid {uid}, not {euid}",
                path.display()
            ),
            StatsError::TooOpen { path, mode } => write!(
                f,
                "refusing the stats directory {}: mode {mode:04o} lets other users in (group and \
                 other bits must be clear, as in 0700)",
                path.display()
            ),
            StatsError::Io { what, path, source } => {
                write!(f, "{what} {}: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for StatsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            StatsError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// A file in the stats directory that `collect` did not read although its name is a snapshot's.
#[derive(Debug)]
pub enum Skipped {
    /// A symbolic link (it could point anywhere, or at a device or a pipe).
    Symlink(PathBuf),
    /// Not a regular file.
    NotAFile(PathBuf),
    /// Owned by another user.
    WrongOwner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
    },
    /// Larger than [`MAX_SNAPSHOT_BYTES`].
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size in bytes.
        len: u64,
    },
    /// Opening or reading it failed.
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The system's error.
        source: std::io::Error,
    },
    /// Its contents are not JSON.
    NotJson(PathBuf),
}

impl fmt::Display for Skipped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Skipped::Symlink(p) => write!(f, "skipping {}: a symbolic link", p.display()),
            Skipped::NotAFile(p) => write!(f, "skipping {}: not a regular file", p.display()),
            Skipped::WrongOwner { path, uid } => {
                write!(f, "skipping {}: owned by uid {uid}", path.display())
            }
            Skipped::TooLarge { path, len } => write!(
                f,
                "skipping {}: {len} bytes, more than a snapshot's limit of {MAX_SNAPSHOT_BYTES}",
                path.display()
            ),
            Skipped::Unreadable { path, source } => {
                write!(f, "skipping {}: {source}", path.display())
            }
            Skipped::NotJson(p) => write!(f, "skipping {}: not JSON", p.display()),
        }
    }
}

/// What [`collect`] found.
#[derive(Debug, Default)]
pub struct Collected {
    /// The snapshots of running endpoints, by pid.
    pub snapshots: Vec<Value>,
    /// Files named like snapshots that were not read, and why (for a warning each).
    pub skipped: Vec<Skipped>,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn io_error(what: &'static str, path: &Path, source: std::io::Error) -> StatsError {
    StatsError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The directory running endpoints publish their snapshots in: `$METAROCE_RUN_DIR` (the tests'
/// private directories), else `$XDG_RUNTIME_DIR/metaroce`, else `/tmp/metaroce-<euid>`. Whichever
/// it is, it is used only while it is a directory of this user that no one else may enter.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("METAROCE_RUN_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("metaroce");
    }
    // The effective uid, as the owner check requires it: a name with another id would be a
    // directory this process must refuse.
    PathBuf::from(format!("/tmp/metaroce-{}", euid()))
}

/// Checks that `dir` is a directory (not a symbolic link to one) owned by this user with no
/// permissions for group or other. Anyone else who can write in it could plant links that
/// turn our writes into writes to our other files.
fn check_dir(dir: &Path) -> Result<(), StatsError> {
    let md = fs::symlink_metadata(dir).map_err(|e| io_error("cannot inspect", dir, e))?;
    let ft = md.file_type();
    if ft.is_symlink() {
        return Err(StatsError::Symlink(dir.to_path_buf()));
    }
    if !ft.is_dir() {
        return Err(StatsError::NotADirectory(dir.to_path_buf()));
    }
    let euid = euid();
    if md.uid() != euid {
        return Err(StatsError::WrongOwner {
            path: dir.to_path_buf(),
            uid: md.uid(),
            euid,
        });
    }
    let mode = md.mode() & 0o7777;
    if mode & 0o077 != 0 && mode & 0o022 == 0 {
        // Ours, and nobody else could write in it (an older build made it 0755): whatever is
        // inside is ours, so closing it is enough.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|e| io_error("cannot close", dir, e))?;
        return Ok(());
    }
    if mode & 0o077 != 0 {
        return Err(StatsError::TooOpen {
            path: dir.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// Creates `dir` (mode 0700 given to mkdir itself, so no umask can open it) unless it exists,
/// then checks it: an existing path, whoever made it, must pass the same checks.
fn ensure_dir(dir: &Path) -> Result<(), StatsError> {
    match fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        // Also a link or a file by that name: the check below names what it is.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io_error("cannot create", dir, e)),
    }
    check_dir(dir)
}

fn snapshot_name(pid: u32) -> String {
    format!("{pid}.json")
}

/// A temporary name of its own for every write: a name left by a crash, or anything else in
/// the way, is passed over rather than opened or removed.
fn temp_name(pid: u32, seq: u64) -> String {
    format!(".{pid}.{seq}.tmp")
}

/// A pid as it appears in a file name: decimal digits only, no leading zero, and in the range
/// a process id can take (1 to `pid_t::MAX`), so it never reaches kill() as 0 or a negative
/// number (which would name a process group).
fn parse_pid(s: &str) -> Option<u32> {
    if s.is_empty() || s.starts_with('0') || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let pid = s.parse::<u32>().ok()?;
    libc::pid_t::try_from(pid).ok()?;
    Some(pid)
}

/// What a file name in the stats directory is.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    /// `<pid>.json`.
    Snapshot(u32),
    /// `.<pid>.<seq>.tmp`, a write in progress or left by a crash.
    Temp(u32),
}

fn parse_entry(name: &str) -> Option<Entry> {
    if let Some(pid) = name.strip_suffix(".json") {
        return parse_pid(pid).map(Entry::Snapshot);
    }
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (pid, seq) = rest.split_once('.')?;
    seq.parse::<u64>().ok()?;
    parse_pid(pid).map(Entry::Temp)
}

/// Whether the process `pid` (as [`parse_pid`] accepts it) no longer exists. Only ESRCH says
/// so: EPERM means it exists under another user, and any other answer is not proof.
fn process_gone(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    if pid <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists and may be signalled; `pid` is
    // positive, so it names one process and never a group or every process.
    let r = unsafe { libc::kill(pid, 0) };
    r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
}

/// Removes `path` if it is a regular file of this user. An unlink never follows a link, and
/// nothing but our own files (and no link) is ours to remove.
fn remove_own_file(path: &Path) {
    if let Ok(md) = fs::symlink_metadata(path) {
        if md.file_type().is_file() && md.uid() == euid() {
            let _ = fs::remove_file(path);
        }
    }
}

static PUBLISH_SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes this process's snapshot atomically (to a fresh temporary file, then renamed over
/// `<pid>.json`) in the checked [`run_dir`].
pub fn publish(v: &Value) -> Result<PathBuf, StatsError> {
    publish_in(&run_dir(), v)
}

fn publish_in(dir: &Path, v: &Value) -> Result<PathBuf, StatsError> {
    publish_at(dir, std::process::id(), v, &PUBLISH_SEQ)
}

/// [`publish`] into `dir` as `pid`, numbering temporary files from `seq`.
fn publish_at(dir: &Path, pid: u32, v: &Value, seq: &AtomicU64) -> Result<PathBuf, StatsError> {
    ensure_dir(dir)?;
    let bytes = v.to_string();
    let path = dir.join(snapshot_name(pid));
    for _ in 0..TEMP_ATTEMPTS {
        let tmp = dir.join(temp_name(pid, seq.fetch_add(1, Ordering::Relaxed)));
        // O_EXCL creates a new file or fails, also on a link by that name (which it does not
        // follow); O_NOFOLLOW says so once more. 0600 is given to open itself.
        let opened = fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp);
        let mut file = match opened {
            Ok(f) => f,
            Err(e) if e.kind() == ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_error("cannot create", &tmp, e)),
        };
        let written = file.write_all(bytes.as_bytes());
        drop(file);
        // rename replaces whatever is at `path`, a planted link included, without following it.
        let done = written
            .map_err(|e| io_error("cannot write", &tmp, e))
            .and_then(|()| fs::rename(&tmp, &path).map_err(|e| io_error("cannot rename", &tmp, e)));
        if done.is_err() {
            // The file this call just created in the private directory.
            let _ = fs::remove_file(&tmp);
        }
        return done.map(|()| path);
    }
    Err(io_error(
        "no free temporary name after several attempts in",
        dir,
        ErrorKind::AlreadyExists.into(),
    ))
}

/// [`publish`] for a running tool: a failure is reported on stderr the first time in the
/// process only (snapshots go out every half second, and a refused directory stays refused).
/// Later attempts still check the directory first, so a refused one is never written to.
pub fn publish_best_effort(v: &Value) {
    static REPORTED: AtomicBool = AtomicBool::new(false);
    if let Some(e) = publish_reporting_once(&run_dir(), v, &REPORTED) {
        eprintln!("metaroce: not publishing statistics: {e}");
    }
}

/// Publishes into `dir` and returns the error only if `reported` was not yet set.
fn publish_reporting_once(dir: &Path, v: &Value, reported: &AtomicBool) -> Option<StatsError> {
    let e = publish_in(dir, v).err()?;
    (!reported.swap(true, Ordering::Relaxed)).then_some(e)
}

/// Removes this process's snapshot, if the directory passes its checks and the snapshot is a
/// regular file of ours.
pub fn unpublish() {
    unpublish_in(&run_dir(), std::process::id());
}

fn unpublish_in(dir: &Path, pid: u32) {
    if check_dir(dir).is_ok() {
        remove_own_file(&dir.join(snapshot_name(pid)));
    }
}

/// The snapshots of endpoints still running, all or only `pid`'s, from the checked
/// [`run_dir`]. No directory means no endpoint. Files of processes that are gone are skipped
/// and removed.
pub fn collect(pid: Option<u32>) -> Result<Collected, StatsError> {
    collect_in(&run_dir(), pid)
}

fn collect_in(dir: &Path, want: Option<u32>) -> Result<Collected, StatsError> {
    let mut out = Collected::default();
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(out),
        _ => check_dir(dir)?,
    }
    let rd = fs::read_dir(dir).map_err(|e| io_error("cannot list", dir, e))?;
    let euid = euid();
    for e in rd.flatten() {
        let name = e.file_name();
        let Some(entry) = name.to_str().and_then(parse_entry) else {
            continue;
        };
        let path = e.path();
        let pid = match entry {
            Entry::Temp(pid) => {
                if process_gone(pid) {
                    remove_own_file(&path);
                }
                continue;
            }
            Entry::Snapshot(pid) => pid,
        };
        if want.is_some_and(|w| w != pid) {
            continue;
        }
        // Gone meanwhile (the endpoint ended): nothing to say.
        let Ok(md) = fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = md.file_type();
        if ft.is_symlink() {
            out.skipped.push(Skipped::Symlink(path));
            continue;
        }
        if !ft.is_file() {
            out.skipped.push(Skipped::NotAFile(path));
            continue;
        }
        if md.uid() != euid {
            out.skipped.push(Skipped::WrongOwner {
                path,
                uid: md.uid(),
            });
            continue;
        }
        if process_gone(pid) {
            remove_own_file(&path);
            continue;
        }
        if md.len() > MAX_SNAPSHOT_BYTES {
            out.skipped.push(Skipped::TooLarge {
                path,
                len: md.len(),
            });
            continue;
        }
        match read_snapshot(&path, euid) {
            Ok(Some(v)) => out.snapshots.push(v),
            Ok(None) => {}
            Err(s) => out.skipped.push(s),
        }
    }
    out.snapshots.sort_by_key(|v| v["pid"].as_u64());
    Ok(out)
}

/// Reads a snapshot checked by name and lstat, checking again what was opened: the file may
/// have been replaced since. `Ok(None)` if it is gone.
fn read_snapshot(path: &Path, euid: u32) -> Result<Option<Value>, Skipped> {
    // O_NOFOLLOW: a link put there since the lstat fails (ELOOP) instead of being read.
    // O_NONBLOCK: a pipe put there cannot hang the open; fstat below refuses it.
    let file = match fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(Skipped::Symlink(path.to_path_buf()))
        }
        Err(source) => {
            return Err(Skipped::Unreadable {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    let unreadable = |source: std::io::Error| Skipped::Unreadable {
        path: path.to_path_buf(),
        source,
    };
    let md = file.metadata().map_err(unreadable)?;
    if !md.file_type().is_file() {
        return Err(Skipped::NotAFile(path.to_path_buf()));
    }
    if md.uid() != euid {
        return Err(Skipped::WrongOwner {
            path: path.to_path_buf(),
            uid: md.uid(),
        });
    }
    // The file may grow after the fstat: read one byte past the limit at most.
    let mut bytes = Vec::new();
    file.take(MAX_SNAPSHOT_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(unreadable)?;
    if bytes.len() as u64 > MAX_SNAPSHOT_BYTES {
        return Err(Skipped::TooLarge {
            path: path.to_path_buf(),
            len: bytes.len() as u64,
        });
    }
    serde_json::from_slice(&bytes)
        .map(Some)
        .map_err(|_| Skipped::NotJson(path.to_path_buf()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::os::unix::fs::symlink;
    use std::sync::atomic::AtomicU32;

    /// A private directory of the test's own (the tests run in parallel and set no environment
    /// variable), removed when dropped; links inside are removed, not followed.
    struct Scratch(PathBuf);

    impl Scratch {
        fn new(tag: &str) -> Scratch {
            static N: AtomicU32 = AtomicU32::new(0);
            let n = N.fetch_add(1, Ordering::Relaxed);
            let p = std::env::temp_dir().join(format!(
                "metaroce-stats-test-{}-{n}-{tag}",
                std::process::id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::DirBuilder::new().mode(0o700).create(&p).unwrap();
            Scratch(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn snapshot(pid: u32) -> Value {
        json!({ "pid": pid, "name": "test", "device": {}, "qps": [] })
    }

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// A file with contents that must survive every test.
    fn victim(s: &Scratch) -> PathBuf {
        let v = s.0.join("victim");
        fs::write(&v, "private\n").unwrap();
        v
    }

    /// A pid no process can have: above the kernel's pid_max, yet a valid pid_t, so kill()
    /// answers ESRCH for it.
    fn dead_pid() -> u32 {
        let max = fs::read_to_string("/proc/sys/kernel/pid_max")
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            // PID_MAX_LIMIT on 64-bit Linux: pid_max cannot exceed it.
            .unwrap_or(4 << 20);
        max + 1
    }

    #[test]
    fn publish_creates_a_private_directory_and_file() {
        let s = Scratch::new("create");
        let dir = s.0.join("run");
        let path = publish_in(&dir, &snapshot(std::process::id())).unwrap();
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&path), 0o600);
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(path, dir.join(format!("{}.json", std::process::id())));
        // No temporary file stays behind.
        assert_eq!(names(&dir), [format!("{}.json", std::process::id())]);
        // A second publication replaces the first.
        publish_in(&dir, &snapshot(std::process::id())).unwrap();
        assert_eq!(names(&dir).len(), 1);
        let c = collect_in(&dir, None).unwrap();
        assert_eq!(c.snapshots, [snapshot(std::process::id())]);
        assert!(c.skipped.is_empty(), "{:?}", c.skipped);
        unpublish_in(&dir, std::process::id());
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn an_open_directory_is_refused_and_nothing_written() {
        let s = Scratch::new("open");
        let dir = s.0.join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o775)).unwrap();
        let e = publish_in(&dir, &snapshot(1)).unwrap_err();
        assert!(
            matches!(e, StatsError::TooOpen { mode: 0o775, .. }),
            "{e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.contains(&dir.display().to_string()) && msg.contains("mode 0775"),
            "{msg}"
        );
        assert!(names(&dir).is_empty());
        assert!(matches!(
            collect_in(&dir, None),
            Err(StatsError::TooOpen { mode: 0o775, .. })
        ));
        // Group bits alone are enough to refuse it.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o720)).unwrap();
        assert!(matches!(
            publish_in(&dir, &snapshot(1)),
            Err(StatsError::TooOpen { mode: 0o720, .. })
        ));
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn our_directory_readable_by_others_but_writable_by_none_is_closed_and_used() {
        let s = Scratch::new("closed");
        let dir = s.0.join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        publish_in(&dir, &snapshot(1)).unwrap();
        let mode = fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, 0o700);
        assert_eq!(names(&dir).len(), 1);
    }

    #[test]
    fn a_refusal_is_reported_once() {
        let s = Scratch::new("once");
        let dir = s.0.join("run");
        fs::create_dir(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o777)).unwrap();
        let reported = AtomicBool::new(false);
        let first = publish_reporting_once(&dir, &snapshot(1), &reported);
        assert!(
            matches!(first, Some(StatsError::TooOpen { mode: 0o777, .. })),
            "{first:?}"
        );
        for _ in 0..3 {
            assert!(publish_reporting_once(&dir, &snapshot(1), &reported).is_none());
        }
        assert!(names(&dir).is_empty());
    }

    #[test]
    fn a_symlink_or_a_file_as_the_directory_is_refused() {
        let s = Scratch::new("link");
        let real = s.0.join("real");
        fs::DirBuilder::new().mode(0o700).create(&real).unwrap();
        let link = s.0.join("run");
        symlink(&real, &link).unwrap();
        let e = publish_in(&link, &snapshot(1)).unwrap_err();
        assert!(matches!(&e, StatsError::Symlink(p) if *p == link), "{e:?}");
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert!(names(&real).is_empty());
        assert!(matches!(
            collect_in(&link, None),
            Err(StatsError::Symlink(_))
        ));
        // A dangling link where the directory would be created is not created through either.
        let dangling = s.0.join("dangling");
        symlink(s.0.join("target"), &dangling).unwrap();
        assert!(matches!(
            publish_in(&dangling, &snapshot(1)),
            Err(StatsError::Symlink(_))
        ));
        assert!(!s.0.join("target").exists());
        let file = s.0.join("file");
        fs::write(&file, "").unwrap();
        assert!(matches!(
            publish_in(&file, &snapshot(1)),
            Err(StatsError::NotADirectory(_))
        ));
        assert_eq!(fs::read(&file).unwrap(), b"");
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if euid() != 0 {
            eprintln!(
                "a_directory_of_another_user_is_refused: SKIPPED, not run as root (chown needs it); \
                 nothing was checked"
            );
            return;
        }
        let s = Scratch::new("owner");
        let dir = s.0.join("run");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(65534), None).unwrap();
        let e = publish_in(&dir, &snapshot(1)).unwrap_err();
        assert!(
            matches!(
                e,
                StatsError::WrongOwner {
                    uid: 65534,
                    euid: 0,
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("owned by uid 65534, not 0"), "{e}");
        assert!(names(&dir).is_empty());
        assert!(matches!(
            collect_in(&dir, None),
            Err(StatsError::WrongOwner { uid: 65534, .. })
        ));
        // A snapshot of another user in our directory is not read.
        let ours = s.0.join("ours");
        let pid = std::process::id();
        publish_in(&ours, &snapshot(pid)).unwrap();
        std::os::unix::fs::chown(ours.join(format!("{pid}.json")), Some(65534), None).unwrap();
        let c = collect_in(&ours, None).unwrap();
        assert!(c.snapshots.is_empty());
        assert!(
            matches!(c.skipped[..], [Skipped::WrongOwner { uid: 65534, .. }]),
            "{:?}",
            c.skipped
        );
        // Nor removed by unpublish.
        unpublish_in(&ours, pid);
        assert_eq!(names(&ours).len(), 1);
    }

    #[test]
    fn a_planted_symlink_at_the_snapshot_is_replaced_not_followed() {
        let s = Scratch::new("plant");
        let victim = victim(&s);
        let dir = s.0.join("run");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let pid = std::process::id();
        let path = dir.join(format!("{pid}.json"));
        symlink(&victim, &path).unwrap();
        let victim_mode = mode(&victim);
        publish_in(&dir, &snapshot(pid)).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "private\n");
        assert_eq!(mode(&victim), victim_mode);
        let md = fs::symlink_metadata(&path).unwrap();
        assert!(md.file_type().is_file());
        assert_eq!(md.mode() & 0o7777, 0o600);
        let back: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        assert_eq!(back, snapshot(pid));
    }

    #[test]
    fn a_planted_symlink_or_a_stale_file_at_the_temporary_name_is_passed_over() {
        let s = Scratch::new("temp");
        let victim = victim(&s);
        let dir = s.0.join("run");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let pid = 4242;
        let link = dir.join(temp_name(pid, 0));
        symlink(&victim, &link).unwrap();
        // As left by a crashed process of the same pid.
        let stale = dir.join(temp_name(pid, 1));
        fs::write(&stale, "stale").unwrap();
        let seq = AtomicU64::new(0);
        let path = publish_at(&dir, pid, &snapshot(pid), &seq).unwrap();
        assert_eq!(seq.load(Ordering::Relaxed), 3, "the third name was used");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "private\n");
        assert!(fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(fs::read_to_string(&stale).unwrap(), "stale");
        assert!(fs::symlink_metadata(&path).unwrap().file_type().is_file());
        assert_eq!(mode(&path), 0o600);
        // Names in the way all along: an error, still nothing followed.
        let seq = AtomicU64::new(100);
        for n in 100..100 + u64::from(TEMP_ATTEMPTS) {
            symlink(&victim, dir.join(temp_name(pid, n))).unwrap();
        }
        let e = publish_at(&dir, pid, &snapshot(pid), &seq).unwrap_err();
        assert!(matches!(e, StatsError::Io { .. }), "{e:?}");
        assert_eq!(fs::read_to_string(&victim).unwrap(), "private\n");
    }

    #[test]
    fn collect_reads_only_sound_snapshots() {
        let me = std::process::id();
        let s = Scratch::new("collect");

        // A link named like a live snapshot, pointing at a valid one.
        let dir = s.0.join("link");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let elsewhere = s.0.join("elsewhere.json");
        fs::write(&elsewhere, snapshot(me).to_string()).unwrap();
        symlink(&elsewhere, dir.join(format!("{me}.json"))).unwrap();
        let c = collect_in(&dir, None).unwrap();
        assert!(c.snapshots.is_empty());
        assert!(
            matches!(c.skipped[..], [Skipped::Symlink(_)]),
            "{:?}",
            c.skipped
        );
        assert!(c.skipped[0].to_string().contains("a symbolic link"));

        // An oversized file: skipped with a warning, not read.
        let dir = s.0.join("big");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let mut big = snapshot(me).to_string().into_bytes();
        big.resize(MAX_SNAPSHOT_BYTES as usize + 1, b' ');
        fs::write(dir.join(format!("{me}.json")), &big).unwrap();
        let c = collect_in(&dir, None).unwrap();
        assert!(c.snapshots.is_empty());
        assert!(
            matches!(c.skipped[..], [Skipped::TooLarge { len, .. }] if len == MAX_SNAPSHOT_BYTES + 1),
            "{:?}",
            c.skipped
        );
        // At the limit it is read.
        big.truncate(MAX_SNAPSHOT_BYTES as usize);
        fs::write(dir.join(format!("{me}.json")), &big).unwrap();
        assert_eq!(collect_in(&dir, None).unwrap().snapshots.len(), 1);

        // A pipe is not opened (it would block).
        let dir = s.0.join("fifo");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let fifo = std::ffi::CString::new(format!("{}/{me}.json", dir.display())).unwrap();
        // SAFETY: `fifo` is a NUL-terminated path that outlives the call.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        let c = collect_in(&dir, None).unwrap();
        assert!(
            matches!(c.skipped[..], [Skipped::NotAFile(_)]),
            "{:?}",
            c.skipped
        );

        // Odd names, a dead pid and a good snapshot together.
        let dir = s.0.join("mixed");
        let dead = dead_pid();
        publish_at(&dir, me, &snapshot(me), &AtomicU64::new(0)).unwrap();
        publish_at(&dir, dead, &snapshot(dead), &AtomicU64::new(0)).unwrap();
        // A crashed writer's temporary file, of a process that is gone.
        fs::write(dir.join(temp_name(dead, 7)), "x").unwrap();
        let odd = [
            "abc.json".to_string(),
            "0.json".into(),
            "007.json".into(),
            "+7.json".into(),
            format!("{}.json", u32::MAX),
            format!("{me}.json.bak"),
        ];
        for n in &odd {
            fs::write(dir.join(n), snapshot(7).to_string()).unwrap();
        }
        let c = collect_in(&dir, None).unwrap();
        assert_eq!(c.snapshots, [snapshot(me)]);
        assert!(c.skipped.is_empty(), "{:?}", c.skipped);
        // The dead process's files are gone; the odd names are left alone.
        let mut left = odd.to_vec();
        left.push(format!("{me}.json"));
        left.sort();
        assert_eq!(names(&dir), left);
        // Asking for one pid reads only its file.
        assert!(collect_in(&dir, Some(1)).unwrap().snapshots.is_empty());
        assert_eq!(collect_in(&dir, Some(me)).unwrap().snapshots.len(), 1);

        // No directory: no endpoint, and nothing created.
        let none = s.0.join("none");
        let c = collect_in(&none, None).unwrap();
        assert!(c.snapshots.is_empty() && c.skipped.is_empty());
        assert!(!none.exists());
    }

    #[test]
    fn unpublish_removes_only_our_regular_file() {
        let s = Scratch::new("unpublish");
        let victim = victim(&s);
        let dir = s.0.join("run");
        fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
        let link = dir.join("4243.json");
        symlink(&victim, &link).unwrap();
        unpublish_in(&dir, 4243);
        assert!(fs::symlink_metadata(&link).is_ok());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "private\n");
        publish_at(&dir, 4244, &snapshot(4244), &AtomicU64::new(0)).unwrap();
        unpublish_in(&dir, 4244);
        assert_eq!(names(&dir), ["4243.json"]);
        // In a refused directory nothing is removed.
        publish_at(&dir, 4245, &snapshot(4245), &AtomicU64::new(0)).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o775)).unwrap();
        unpublish_in(&dir, 4245);
        assert_eq!(names(&dir), ["4243.json", "4245.json"]);
    }

    #[test]
    fn snapshot_names_are_canonical_pids() {
        assert_eq!(parse_entry("12.json"), Some(Entry::Snapshot(12)));
        assert_eq!(parse_entry(".12.3.tmp"), Some(Entry::Temp(12)));
        for bad in [
            "0.json",
            "012.json",
            "+12.json",
            "-12.json",
            "12 .json",
            ".json",
            "2147483648.json",
            "4294967295.json",
            ".12.tmp",
            ".12.x.tmp",
            "12.json.tmp",
        ] {
            assert_eq!(parse_entry(bad), None, "{bad}");
        }
        assert_eq!(
            parse_entry("2147483647.json"),
            Some(Entry::Snapshot(2147483647))
        );
    }
}
