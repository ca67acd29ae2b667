//! The out-of-band exchange, as perftest does it: a TCP connection over which both ends trade
//! addresses, queue pair numbers, initial sequence numbers and memory keys before the transfer,
//! and synchronise between phases.
//!
//! Every message is one line: `METAROCE/<version> <verb> key=value ...`. The version is checked
//! on every message, so a peer speaking another version gets a clear error, not a hang.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The version of the exchange this build speaks.
pub const VERSION: u32 = 2;
/// perftest's default port.
pub const DEFAULT_PORT: u16 = 18515;

/// Why the exchange failed.
#[derive(Debug)]
pub enum OobError {
    /// The name did not resolve.
    Resolve(String),
    /// Nothing listens there.
    Refused(SocketAddr),
    /// No answer in time.
    Unreachable(SocketAddr, io::Error),
    /// The peer speaks another version.
    Version {
        /// Ours.
        ours: u32,
        /// Theirs.
        theirs: String,
    },
    /// The peer is not a MetaRoCE endpoint.
    NotMetaroce(String),
    /// The peer closed the connection.
    Closed,
    /// No whole message came within the time allowed.
    TimedOut(Duration),
    /// The peer's heartbeat stopped: it is stopped, gone, or cut off.
    Silent(Duration),
    /// The peer reported an error.
    Peer(String),
    /// A message lacks a field or has a bad one.
    Field(String),
    /// Another socket error.
    Io(io::Error),
}

impl fmt::Display for OobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OobError::Resolve(s) => write!(f, "cannot resolve {s}"),
            OobError::Refused(a) => {
                write!(f, "{a} refused the connection (is the server running?)")
            }
            OobError::Unreachable(a, e) => write!(f, "{a} is unreachable: {e}"),
            OobError::Version { ours, theirs } => write!(
                f,
                "the peer speaks exchange version {theirs}, this build speaks {ours}"
            ),
            OobError::NotMetaroce(l) => {
                write!(f, "the peer is not a metaroce endpoint (it said {l:?})")
            }
            OobError::Closed => write!(f, "the peer closed the connection"),
            OobError::TimedOut(t) => {
                write!(
                    f,
                    "no whole message from the peer within {} s",
                    (t.as_secs_f64() * 10.0).round() / 10.0
                )
            }
            OobError::Silent(t) => write!(
                f,
                "the peer sent nothing for {} s (stopped, gone or cut off)",
                t.as_secs()
            ),
            OobError::Peer(m) => write!(f, "the peer reported: {m}"),
            OobError::Field(m) => write!(f, "bad message from the peer: {m}"),
            OobError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for OobError {}

impl From<io::Error> for OobError {
    fn from(e: io::Error) -> Self {
        OobError::Io(e)
    }
}

/// One message: a verb and fields.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Message {
    /// What it is (`hello`, `go`, `ready`, `done`, `result`, `error`).
    pub verb: String,
    /// Its fields.
    pub fields: BTreeMap<String, String>,
}

impl Message {
    /// A message with no fields.
    pub fn new(verb: &str) -> Message {
        Message {
            verb: verb.into(),
            fields: BTreeMap::new(),
        }
    }

    /// Adds a field.
    pub fn with(mut self, key: &str, value: impl fmt::Display) -> Message {
        self.fields.insert(key.into(), value.to_string());
        self
    }

    /// A field as text.
    pub fn text(&self, key: &str) -> Result<&str, OobError> {
        self.fields
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| OobError::Field(format!("{} lacks {key}", self.verb)))
    }

    /// A field parsed.
    pub fn get<T: std::str::FromStr>(&self, key: &str) -> Result<T, OobError> {
        let t = self.text(key)?;
        t.parse()
            .map_err(|_| OobError::Field(format!("{key}={t:?} in {}", self.verb)))
    }

    fn encode(&self) -> String {
        let mut s = format!("METAROCE/{VERSION} {}", self.verb);
        for (k, v) in &self.fields {
            s.push(' ');
            s.push_str(k);
            s.push('=');
            escape_into(&mut s, v);
        }
        s.push('\n');
        s
    }

    fn decode(line: &str) -> Result<Message, OobError> {
        let mut words = line.split_ascii_whitespace();
        let head = words.next().unwrap_or("");
        let Some(version) = head.strip_prefix("METAROCE/") else {
            return Err(OobError::NotMetaroce(line.chars().take(60).collect()));
        };
        if version != VERSION.to_string() {
            return Err(OobError::Version {
                ours: VERSION,
                theirs: version.into(),
            });
        }
        let verb = words
            .next()
            .ok_or_else(|| OobError::Field("no verb".into()))?;
        let mut m = Message::new(verb);
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| OobError::Field(format!("{w:?} is not key=value")))?;
            m.fields.insert(k.into(), unescape(v));
        }
        if m.verb == "error" {
            return Err(OobError::Peer(m.text("msg").unwrap_or("unknown").into()));
        }
        Ok(m)
    }
}

/// Appends `v` with `%` and ASCII whitespace (which separates the words of a line) as `%XX`.
fn escape_into(out: &mut String, v: &str) {
    for c in v.chars() {
        if c == '%' || c.is_ascii_whitespace() {
            out.push_str(&format!("%{:02X}", c as u32));
        } else {
            out.push(c);
        }
    }
}

/// The value `escape_into` wrote; a `%` not followed by two hex digits stands for itself.
fn unescape(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = b
            .get(i + 1..i + 3)
            .filter(|h| h.iter().all(u8::is_ascii_hexdigit))
            .and_then(|h| std::str::from_utf8(h).ok());
        match (b[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(x)) => {
                out.push(x);
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One end of the exchange.
///
/// Every wait has a deadline for the whole message (a peer that sends a byte at a time cannot
/// stretch it), lines are bounded, the socket has TCP keepalive, and once a session is set up
/// both ends send a heartbeat every [`HEARTBEAT`] from a thread of their own, so that a peer that
/// stops (SIGSTOP, a host that vanishes without a FIN) is noticed within [`SILENCE`] however busy
/// its own loop is.
pub struct Channel {
    stream: Arc<Mutex<TcpStream>>,
    /// Bytes read but not yet taken as messages (at most one line plus one read).
    inbuf: Vec<u8>,
    /// When the peer last sent anything (a heartbeat counts).
    last_heard: Instant,
    /// Whether both ends send heartbeats (set up by [`Channel::start_heartbeat`]).
    heartbeat: Option<Heartbeat>,
    peer: SocketAddr,
    local: SocketAddr,
}

/// The heartbeat thread's handle: dropping it stops the thread.
struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

/// Lines longer than this are refused (a peer cannot make us buffer without bound).
const MAX_LINE: usize = 64 * 1024;
/// How often a set-up session sends its heartbeat.
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// Silence from a peer whose heartbeat runs, after which it counts as gone.
pub const SILENCE: Duration = Duration::from_secs(5);
/// The verb of a heartbeat; never handed to the caller.
const ALIVE: &str = "alive";

impl Channel {
    /// Connects to a server, waiting up to `timeout`.
    pub fn connect(host: &str, port: u16, timeout: Duration) -> Result<Channel, OobError> {
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|_| OobError::Resolve(format!("{host}:{port}")))?
            .collect();
        let mut last = None;
        for a in addrs {
            match TcpStream::connect_timeout(&a, timeout) {
                Ok(s) => return Channel::new(s),
                Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                    last = Some(OobError::Refused(a))
                }
                Err(e) => last = Some(OobError::Unreachable(a, e)),
            }
        }
        Err(last.unwrap_or_else(|| OobError::Resolve(format!("{host}:{port}"))))
    }

    /// Waits for one client.
    pub fn accept(listener: &TcpListener) -> Result<Channel, OobError> {
        let (s, _) = listener.accept()?;
        Channel::new(s)
    }

    /// Waits for one client until `deadline`.
    pub fn accept_until(listener: &TcpListener, deadline: Instant) -> Result<Channel, OobError> {
        let allowed = deadline.saturating_duration_since(Instant::now());
        listener.set_nonblocking(true)?;
        let r = loop {
            match listener.accept() {
                Ok((s, _)) => break s.set_nonblocking(false).map(|()| s),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break Err(io::ErrorKind::TimedOut.into());
                    }
                    if let Err(e) = poll_fd(listener.as_raw_fd(), libc::POLLIN, Some(left)) {
                        break Err(e);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => break Err(e),
            }
        };
        listener.set_nonblocking(false)?;
        match r {
            Ok(s) => Channel::new(s),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Err(OobError::TimedOut(allowed)),
            Err(e) => Err(e.into()),
        }
    }

    fn new(stream: TcpStream) -> Result<Channel, OobError> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        set_keepalive(&stream)?;
        Ok(Channel {
            peer: stream.peer_addr()?,
            local: stream.local_addr()?,
            stream: Arc::new(Mutex::new(stream)),
            inbuf: Vec::new(),
            last_heard: Instant::now(),
            heartbeat: None,
        })
    }

    /// The local address of the TCP connection (the address the peer reaches us at).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.peer)
    }

    /// Starts sending a heartbeat every [`HEARTBEAT`] and expecting the peer's: from now on a
    /// peer silent for [`SILENCE`] is an error ([`OobError::Silent`]). Both ends start it once the
    /// session is set up.
    pub fn start_heartbeat(&mut self) -> Result<(), OobError> {
        if self.heartbeat.is_some() {
            return Ok(());
        }
        let stop = Arc::new(AtomicBool::new(false));
        let line = Message::new(ALIVE).encode();
        let (stream, flag) = (self.stream.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("oob-heartbeat".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    if write_line(&stream, line.as_bytes()).is_err() {
                        return;
                    }
                    std::thread::park_timeout(HEARTBEAT);
                }
            })?;
        self.last_heard = Instant::now();
        self.heartbeat = Some(Heartbeat {
            stop,
            thread: Some(thread),
        });
        Ok(())
    }

    /// Sends a message.
    pub fn send(&mut self, m: &Message) -> Result<(), OobError> {
        write_line(&self.stream, m.encode().as_bytes())?;
        Ok(())
    }

    /// Reports an error to the peer (best effort).
    pub fn send_error(&mut self, msg: &str) {
        let _ = self.send(&Message::new("error").with("msg", msg));
    }

    /// Receives a message, waiting up to `timeout` for the whole of it (None: as long as the
    /// peer's heartbeat runs, or forever before it does).
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Message, OobError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(m) = self.take_message()? {
                return Ok(m);
            }
            let now = Instant::now();
            let mut wait = deadline.map(|d| d.saturating_duration_since(now));
            if wait == Some(Duration::ZERO) {
                return Err(OobError::TimedOut(timeout.unwrap_or_default()));
            }
            if self.heartbeat.is_some() {
                let left = SILENCE.saturating_sub(now - self.last_heard);
                wait = Some(wait.map_or(left, |w| w.min(left)));
            }
            self.check_silence()?;
            wait_readable(&self.stream, wait)?;
            self.read_available()?;
        }
    }

    /// Receives a message with verb `verb`.
    pub fn expect(&mut self, verb: &str, timeout: Option<Duration>) -> Result<Message, OobError> {
        let m = self.recv(timeout)?;
        if m.verb != verb {
            return Err(OobError::Field(format!("expected {verb}, got {}", m.verb)));
        }
        Ok(m)
    }

    /// A message if a whole one has arrived, without blocking (one system call when none has).
    /// A closed connection, or a peer whose heartbeat stopped, is an error.
    pub fn poll(&mut self) -> Result<Option<Message>, OobError> {
        if let Some(m) = self.take_message()? {
            return Ok(Some(m));
        }
        self.read_available()?;
        if let Some(m) = self.take_message()? {
            return Ok(Some(m));
        }
        self.check_silence()?;
        Ok(None)
    }

    fn check_silence(&self) -> Result<(), OobError> {
        if self.heartbeat.is_some() && self.last_heard.elapsed() > SILENCE {
            return Err(OobError::Silent(SILENCE));
        }
        Ok(())
    }

    /// Reads what the socket holds (without blocking) into the buffer.
    fn read_available(&mut self) -> Result<(), OobError> {
        let mut chunk = [0u8; 4096];
        loop {
            let r = {
                let mut s = lock(&self.stream);
                s.read(&mut chunk)
            };
            match r {
                Ok(0) => return Err(OobError::Closed),
                Ok(n) => {
                    self.last_heard = Instant::now();
                    self.inbuf.extend_from_slice(&chunk[..n]);
                    if self.inbuf.len() > MAX_LINE {
                        // Never more than a line's bound buffered: the messages in it are taken
                        // before anything more is read.
                        if !self.inbuf[..MAX_LINE].contains(&b'\n') {
                            return Err(OobError::NotMetaroce(
                                String::from_utf8_lossy(&self.inbuf[..60]).into_owned(),
                            ));
                        }
                        return Ok(());
                    }
                    if n < chunk.len() {
                        return Ok(());
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The first whole line in the buffer as a message; heartbeats are taken and skipped.
    fn take_message(&mut self) -> Result<Option<Message>, OobError> {
        loop {
            let Some(end) = self.inbuf.iter().position(|&b| b == b'\n') else {
                return Ok(None);
            };
            let line: Vec<u8> = self.inbuf.drain(..=end).collect();
            let text = String::from_utf8_lossy(&line[..end]);
            let m = Message::decode(text.trim_end_matches(['\r', '\n']))?;
            if m.verb != ALIVE {
                return Ok(Some(m));
            }
        }
    }
}

fn lock(s: &Mutex<TcpStream>) -> std::sync::MutexGuard<'_, TcpStream> {
    s.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes a whole line on the non-blocking socket (waiting while the peer's window is full, up
/// to [`SILENCE`]), under the lock so that a heartbeat never lands inside a message.
fn write_line(stream: &Mutex<TcpStream>, mut bytes: &[u8]) -> io::Result<()> {
    let s = lock(stream);
    let deadline = Instant::now() + SILENCE;
    while !bytes.is_empty() {
        match (&*s).write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "the peer takes nothing from the control connection",
                    ));
                }
                poll_fd(s.as_raw_fd(), libc::POLLOUT, Some(left))?;
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits until the socket is readable (or closed), up to `wait` (None: without limit).
fn wait_readable(stream: &Mutex<TcpStream>, wait: Option<Duration>) -> io::Result<()> {
    let fd = lock(stream).as_raw_fd();
    poll_fd(fd, libc::POLLIN, wait)
}

fn poll_fd(fd: i32, events: i16, wait: Option<Duration>) -> io::Result<()> {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = wait.map_or(-1, |w| w.as_millis().clamp(1, i32::MAX as u128) as i32);
    // SAFETY: `p` is one valid pollfd that outlives the call; the count is 1.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(())
}

/// TCP keepalive: a peer host that vanished is found by the kernel within about 10 s of
/// silence even where no heartbeat runs yet.
fn set_keepalive(s: &TcpStream) -> io::Result<()> {
    let set = |level, name, v| crate::udp::socket::set_int_option(s.as_fd(), level, name, v);
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 5)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 1)?;
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_round_trip_with_escaped_values() {
        let m = Message::new("hello")
            .with("qp", "1:2,3:4")
            .with("msg", "a b%c\nd");
        let back = Message::decode(m.encode().trim_end()).unwrap();
        assert_eq!(back, m);
        assert_eq!(back.get::<String>("qp").unwrap(), "1:2,3:4");
    }

    #[test]
    fn another_version_or_protocol_is_named() {
        let e = Message::decode("METAROCE/1 hello").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the peer speaks exchange version 1, this build speaks 2"
        );
        let e = Message::decode("0000:0000:00000001:00000000").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the peer is not a metaroce endpoint"),
            "{e}"
        );
        let e = Message::decode("METAROCE/2 error msg=server%20runs%20write-bw").unwrap_err();
        assert_eq!(e.to_string(), "the peer reported: server runs write-bw");
    }

    proptest::proptest! {
        /// Whatever line a peer sends, decoding it gives a message or a clear error, never a
        /// panic; and a message's fields go through the escaping unchanged.
        #[test]
        fn any_line_decodes_or_is_refused(line in ".{0,300}", key in "[a-z]{1,8}", value in ".{0,80}") {
            let _ = Message::decode(&line);
            let _ = Message::decode(&format!("METAROCE/{VERSION} {line}"));
            let m = Message::new("x").with(&key, &value);
            let back = Message::decode(m.encode().trim_end_matches('\n')).unwrap();
            proptest::prop_assert_eq!(back.text(&key).unwrap(), value.as_str());
        }
    }

    #[test]
    fn refused_and_unreachable_are_told_apart() {
        // A port nobody listens on.
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        drop(l);
        let e = Channel::connect("127.0.0.1", port, Duration::from_secs(1))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, OobError::Refused(_)), "{e}");
        assert!(e.to_string().contains("refused the connection"));
        let e = Channel::connect("no-such-host.invalid", 1, Duration::from_secs(1))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, OobError::Resolve(_)), "{e}");
    }

    #[test]
    fn a_long_line_is_cut_not_buffered_forever() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let t = std::thread::spawn(move || {
            let mut s = TcpStream::connect(addr).unwrap();
            let junk = vec![b'A'; 200_000];
            let _ = s.write_all(&junk);
        });
        let mut c = Channel::accept(&l).unwrap();
        let e = c.recv(Some(Duration::from_secs(5))).unwrap_err();
        assert!(matches!(e, OobError::NotMetaroce(_)), "{e}");
        t.join().unwrap();
    }
}
