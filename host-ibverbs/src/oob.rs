//! The out-of-band exchange, as perftest does it: a TCP connection over which both ends trade
//! addresses, queue pair numbers, initial sequence numbers and memory keys before the transfer,
//! and synchronise between phases.
//!
//! Every message is one line: `METAROCE/<version> <verb> key=value ...`. The version is checked
//! on every message, so a peer speaking another version gets a clear error, not a hang.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The version of the exchange this build speaks.
pub const VERSION: u32 = 1;
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
            // Values never hold spaces or newlines: escape them.
            s.push_str(
                &v.replace('%', "%25")
                    .replace(' ', "%20")
                    .replace('\n', "%0A"),
            );
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
            let v = v
                .replace("%20", " ")
                .replace("%0A", "\n")
                .replace("%25", "%");
            m.fields.insert(k.into(), v);
        }
        if m.verb == "error" {
            return Err(OobError::Peer(m.text("msg").unwrap_or("unknown").into()));
        }
        Ok(m)
    }
}

/// One end of the exchange.
pub struct Channel {
    reader: BufReader<TcpStream>,
    stream: TcpStream,
}

/// Lines longer than this are refused (a peer cannot make us buffer without bound).
const MAX_LINE: u64 = 64 * 1024;

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

    fn new(stream: TcpStream) -> Result<Channel, OobError> {
        stream.set_nodelay(true)?;
        Ok(Channel {
            reader: BufReader::new(stream.try_clone()?),
            stream,
        })
    }

    /// The local address of the TCP connection (the address the peer reaches us at).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.stream.local_addr()
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.stream.peer_addr()
    }

    /// Sends a message.
    pub fn send(&mut self, m: &Message) -> Result<(), OobError> {
        self.stream.write_all(m.encode().as_bytes())?;
        Ok(())
    }

    /// Reports an error to the peer (best effort).
    pub fn send_error(&mut self, msg: &str) {
        let _ = self.send(&Message::new("error").with("msg", msg));
    }

    /// Receives a message, waiting up to `timeout` (None: forever).
    pub fn recv(&mut self, timeout: Option<Duration>) -> Result<Message, OobError> {
        self.stream.set_read_timeout(timeout)?;
        let mut line = String::new();
        let n = (&mut self.reader).take(MAX_LINE).read_line(&mut line)?;
        if n == 0 {
            return Err(OobError::Closed);
        }
        Message::decode(line.trim_end())
    }

    /// Receives a message with verb `verb`.
    pub fn expect(&mut self, verb: &str, timeout: Option<Duration>) -> Result<Message, OobError> {
        let m = self.recv(timeout)?;
        if m.verb != verb {
            return Err(OobError::Field(format!("expected {verb}, got {}", m.verb)));
        }
        Ok(m)
    }

    /// Whether a message is waiting (without blocking).
    pub fn poll(&mut self) -> Result<Option<Message>, OobError> {
        if !self.reader.buffer().is_empty() {
            return self.recv(None).map(Some);
        }
        self.stream.set_nonblocking(true)?;
        let mut b = [0u8; 1];
        let r = self.stream.peek(&mut b);
        self.stream.set_nonblocking(false)?;
        match r {
            Ok(0) => Err(OobError::Closed),
            Ok(_) => self.recv(None).map(Some),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
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
        let e = Message::decode("METAROCE/2 hello").unwrap_err();
        assert_eq!(
            e.to_string(),
            "the peer speaks exchange version 2, this build speaks 1"
        );
        let e = Message::decode("0000:0000:00000001:00000000").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the peer is not a metaroce endpoint"),
            "{e}"
        );
        let e = Message::decode("METAROCE/1 error msg=server%20runs%20write-bw").unwrap_err();
        assert_eq!(e.to_string(), "the peer reported: server runs write-bw");
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
