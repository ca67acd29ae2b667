//! Errors of the UDP transport: which operation failed, and why.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use transport_core::conn::{PostError, RegionError};

/// An operation of the transport's API failed.
#[derive(Debug)]
pub struct Error {
    /// The operation, named as in Verbs (`open_device`, `reg_mr`, `create_qp`, `connect`,
    /// `post_send`, `post_recv`, ...).
    pub op: &'static str,
    /// Why.
    pub kind: ErrorKind,
}

/// Why an operation failed.
#[derive(Debug)]
pub enum ErrorKind {
    /// A system call failed.
    Io {
        /// What was being done.
        what: &'static str,
        /// The address involved, when there is one.
        addr: Option<SocketAddr>,
        /// The system's error.
        source: io::Error,
    },
    /// The queue pair is not connected yet.
    NotConnected,
    /// The queue pair is already connected.
    AlreadyConnected,
    /// The peer's address family differs from the device's.
    AddressFamily,
    /// The local buffer lies outside its memory region.
    LocalBounds {
        /// Offset asked for.
        offset: usize,
        /// Bytes asked for.
        len: usize,
        /// The region's length.
        region_len: usize,
    },
    /// The memory region belongs to another protection domain.
    WrongProtectionDomain,
    /// The memory region lacks local write access, which this operation needs.
    NoLocalWrite,
    /// A zero-length memory region.
    EmptyRegion,
    /// The memory for the region could not be allocated.
    OutOfMemory(usize),
    /// The core refused the work request.
    Post(PostError),
    /// A connection's region table refused the region.
    Region(RegionError),
    /// The queue pair number does not exist on this device.
    NoSuchQp(u32),
    /// A parameter is out of range.
    Invalid(&'static str),
}

impl Error {
    pub(crate) fn new(op: &'static str, kind: ErrorKind) -> Error {
        Error { op, kind }
    }

    pub(crate) fn io(
        op: &'static str,
        what: &'static str,
        addr: Option<SocketAddr>,
        source: io::Error,
    ) -> Error {
        Error::new(op, ErrorKind::Io { what, addr, source })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.op)?;
        match &self.kind {
            ErrorKind::Io { what, addr, source } => match addr {
                Some(a) => write!(f, "{what} {a}: {source}"),
                None => write!(f, "{what}: {source}"),
            },
            ErrorKind::NotConnected => write!(f, "the queue pair is not connected"),
            ErrorKind::AlreadyConnected => write!(f, "the queue pair is already connected"),
            ErrorKind::AddressFamily => {
                write!(f, "the peer's address family differs from the device's")
            }
            ErrorKind::LocalBounds {
                offset,
                len,
                region_len,
            } => write!(
                f,
                "local buffer {offset}..{} lies outside the memory region ({region_len} bytes)",
                offset.saturating_add(*len)
            ),
            ErrorKind::WrongProtectionDomain => {
                write!(f, "the memory region belongs to another protection domain")
            }
            ErrorKind::NoLocalWrite => write!(
                f,
                "the memory region was registered without local write access"
            ),
            ErrorKind::EmptyRegion => write!(f, "a memory region needs at least one byte"),
            ErrorKind::OutOfMemory(n) => write!(f, "cannot allocate {n} bytes"),
            ErrorKind::Post(e) => write!(f, "{e}"),
            ErrorKind::Region(e) => write!(f, "{e}"),
            ErrorKind::NoSuchQp(q) => write!(f, "no queue pair {q:#x} on this device"),
            ErrorKind::Invalid(what) => write!(f, "invalid {what}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
