//! The perftest tools against hostile peers that speak the exchange: port scanners, slow and
//! silent clients, a silent server, a `go` asking for gigabytes, lists shorter than announced,
//! data redirected to another host, and peers stopped in the middle of a run. Each must end in a
//! clear error within its deadline, the server's memory must stay under its cap, and the server
//! must serve the next real client.

mod common;

use common::{bin, port, wait};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `metaroce` server process whose stderr is collected as it comes.
struct Server {
    child: Option<Child>,
    port: u16,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(test: &str, args: &[&str]) -> Server {
        let port = port();
        let mut child = Command::new(bin())
            .arg(test)
            .args(["-p", &port.to_string(), "--data-port", "0"])
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn metaroce");
        let log = Arc::new(Mutex::new(String::new()));
        let (sink, mut err) = (log.clone(), child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        let s = Server {
            child: Some(child),
            port,
            log,
        };
        s.wait_for("Waiting for client", 1, Duration::from_secs(20));
        s
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until `text` has appeared `n` times in the server's stderr.
    fn wait_for(&self, text: &str, n: usize, limit: Duration) -> Duration {
        let start = Instant::now();
        while self.log().matches(text).count() < n {
            assert!(
                start.elapsed() < limit,
                "the server did not say {text:?} {n} times within {limit:?}:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Peak resident memory so far, bytes (VmHWM).
    fn peak_rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb * 1024
    }

    /// A real client's run against it, which must succeed with every byte verified.
    fn serve_real_client(&self, test: &str) {
        let out = Command::new(bin())
            .args([test, "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-n", "50", "-s", "4096", "--data-port", "0", "--json"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "the real client failed: {}\nserver:\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        let j: serde_json::Value =
            serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap())
                .unwrap();
        assert_eq!(j["verified"], true);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A hostile peer that speaks the exchange by hand.
struct Peer {
    stream: TcpStream,
    reader: BufReader<TcpStream>,
}

impl Peer {
    fn connect(port: u16) -> Peer {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        Peer {
            reader: BufReader::new(stream.try_clone().unwrap()),
            stream,
        }
    }

    fn send(&mut self, line: &str) {
        let _ = self.stream.write_all(format!("{line}\n").as_bytes());
    }

    /// The next line that is not a heartbeat, or None when the server closed or `limit` passed.
    fn line(&mut self, limit: Duration) -> Option<String> {
        let end = Instant::now() + limit;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            self.stream.set_read_timeout(Some(left)).unwrap();
            let mut l = String::new();
            match self.reader.read_line(&mut l) {
                Ok(0) | Err(_) => return None,
                Ok(_) if l.contains(" alive") => continue,
                // The exchange escapes spaces, newlines and percent signs in values.
                Ok(_) => {
                    return Some(
                        l.replace("%20", " ")
                            .replace("%0A", "\n")
                            .replace("%25", "%"),
                    )
                }
            }
        }
    }

    /// Reads until the server closes the connection; returns what it said and when it closed.
    fn until_closed(&mut self, limit: Duration) -> (String, Duration) {
        let start = Instant::now();
        let mut said = String::new();
        while let Some(l) = self.line(limit.saturating_sub(start.elapsed())) {
            said.push_str(&l);
        }
        (said, start.elapsed())
    }

    /// A hello for `test` with `qps` connections, then the queue pairs for the server's answer
    /// (data at `data`, `n` queue pairs named). Returns the server's hello.
    fn set_up(&mut self, test: &str, qps: u32, data: &str, n: usize) -> String {
        self.send(&format!(
            "METAROCE/2 hello busy=0 paths=4 qps={qps} test={test} transport=udp window=16 workers=1 session=1"
        ));
        let hello = self
            .line(Duration::from_secs(10))
            .expect("the server's hello");
        assert!(hello.starts_with("METAROCE/2 hello "), "{hello}");
        let qp: Vec<String> = (0..n).map(|k| format!("{}:1:7", 100 + k)).collect();
        self.send(&format!("METAROCE/2 qps data={data} qp={}", qp.join(",")));
        hello
    }
}

#[test]
fn a_port_scan_does_not_end_the_server_even_with_once() {
    let s = Server::start("write-bw", &["--once"]);
    for _ in 0..3 {
        drop(TcpStream::connect(("127.0.0.1", s.port)).unwrap());
    }
    let mut garbage = Peer::connect(s.port);
    garbage.send("GET / HTTP/1.0");
    let (said, _) = garbage.until_closed(Duration::from_secs(5));
    assert!(said.contains("not a metaroce endpoint"), "{said}");
    s.wait_for(
        "a connection that was not a client",
        4,
        Duration::from_secs(5),
    );
    s.serve_real_client("write-bw");
}

#[test]
fn a_hello_a_byte_at_a_time_is_cut_at_its_deadline() {
    let s = Server::start("write-bw", &[]);
    let mut slow = Peer::connect(s.port);
    let start = Instant::now();
    let hello = b"METAROCE/2 hello test=write-bw qps=1 paths=4 window=16\n";
    let mut closed_at = None;
    for b in hello {
        if slow.stream.write_all(&[*b]).is_err() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        let mut probe = [0u8; 256];
        slow.stream.set_nonblocking(true).unwrap();
        let r = slow.stream.peek(&mut probe);
        slow.stream.set_nonblocking(false).unwrap();
        if r.is_ok() {
            closed_at = Some(start.elapsed());
            break;
        }
    }
    let (said, _) = slow.until_closed(Duration::from_secs(5));
    let at = closed_at.expect("the server waited for the whole slow hello");
    assert!(
        said.contains("no whole message from the peer within 10 s"),
        "{said}"
    );
    assert!(at < Duration::from_secs(13), "cut after {at:?}");
    s.serve_real_client("write-bw");
}

#[test]
fn workers_that_never_come_time_out_and_strangers_are_not_taken_as_workers() {
    let s = Server::start("write-bw", &[]);
    let mut first = Peer::connect(s.port);
    first.send("METAROCE/2 hello busy=0 paths=4 qps=1 test=write-bw transport=udp window=16 workers=2 session=77");
    std::thread::sleep(Duration::from_millis(300));
    // A client that is not one of its workers is told the server is busy.
    let mut other = Peer::connect(s.port);
    other.send("METAROCE/2 hello busy=0 paths=4 qps=1 test=write-bw transport=udp window=16 workers=1 session=5");
    let (said, _) = other.until_closed(Duration::from_secs(10));
    assert!(said.contains("busy"), "{said}");
    // The second worker never comes: the set-up ends at its deadline (30 s), with a clear word.
    let (said, after) = first.until_closed(Duration::from_secs(40));
    assert!(said.contains("not every worker came"), "{said}");
    assert!(after < Duration::from_secs(35), "{after:?}");
    s.wait_for("lost the client", 1, Duration::from_secs(5));
    s.serve_real_client("write-bw");
}

#[test]
fn a_client_silent_after_the_exchange_is_dropped_within_seconds() {
    let s = Server::start("write-bw", &[]);
    let mut silent = Peer::connect(s.port);
    silent.set_up("write-bw", 1, "127.0.0.1:9", 1);
    // No heartbeat, no go.
    let (said, after) = silent.until_closed(Duration::from_secs(20));
    assert!(said.contains("sent nothing for 5 s"), "{said}");
    assert!(after < Duration::from_secs(9), "{after:?}");
    s.wait_for("lost the client", 1, Duration::from_secs(5));
    s.serve_real_client("write-bw");
}

#[test]
fn a_server_silent_after_its_hello_or_before_it_ends_the_client_with_a_clear_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let p = listener.local_addr().unwrap().port();
    // Silent before its hello: the client's hello deadline.
    let t = std::thread::spawn(move || {
        let (mut a, _) = listener.accept().unwrap();
        let mut r = BufReader::new(a.try_clone().unwrap());
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        std::thread::sleep(Duration::from_secs(11));
        drop(a.write_all(b""));
        // Then one that answers the hello, takes the queue pairs, and goes silent.
        let (mut b, _) = listener.accept().unwrap();
        let mut r = BufReader::new(b.try_clone().unwrap());
        let mut l = String::new();
        r.read_line(&mut l).unwrap();
        b.write_all(b"METAROCE/2 hello data=127.0.0.1:9 qp=100:1:7\n")
            .unwrap();
        std::thread::sleep(Duration::from_secs(15));
    });
    let run = || {
        let start = Instant::now();
        let out = Command::new(bin())
            .args([
                "write-bw",
                "127.0.0.1",
                "-p",
                &p.to_string(),
                "--data-port",
                "0",
            ])
            .output()
            .unwrap();
        (out, start.elapsed())
    };
    let (out, took) = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no whole message from the peer within 10 s"),
        "{err}"
    );
    assert!(took < Duration::from_secs(12), "{took:?}");
    let (out, took) = run();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("sent nothing for 5 s"), "{err}");
    assert!(took < Duration::from_secs(9), "{took:?}");
    t.join().unwrap();
}

#[test]
fn a_small_go_cannot_make_the_server_take_gigabytes() {
    let s = Server::start("write-bw", &["--max-memory", "256M"]);
    let mut evil = Peer::connect(s.port);
    evil.set_up("write-bw", 2, "127.0.0.1:9", 2);
    // 1 GiB Writes: one slot per connection, two connections, the server's own buffers twice.
    evil.send("METAROCE/2 go dst=1:2:1073741824,1:2:1073741824 iters=5000 seed=1 size=1073741824 slots=1 src=1:2:1073741824,1:2:1073741824");
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(said.contains("more than the 256 MiB allowed"), "{said}");
    // send-bw's receive buffers are counted too: 64 connections of 1 MiB messages take 128 MiB
    // of pattern and target buffers, 8 receive buffers each, 512 MiB more, 2 MiB of scratch and
    // 1 MiB of expected patterns kept.
    drop(s);
    let s = Server::start("send-bw", &["--max-memory", "256M"]);
    let mut evil = Peer::connect(s.port);
    evil.set_up("send-bw", 64, "127.0.0.1:9", 64);
    let bufs: Vec<&str> = vec!["1:2:1048576"; 64];
    evil.send(&format!(
        "METAROCE/2 go dst={0} iters=1 seed=1 size=1048576 slots=1 src={0}",
        bufs.join(",")
    ));
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(
        said.contains("needs 643 MiB of buffers, more than the 256 MiB allowed"),
        "{said}"
    );
    assert!(
        s.peak_rss() < 256 << 20,
        "the server's peak memory reached {} MiB",
        s.peak_rss() >> 20
    );
    s.serve_real_client("send-bw");
    assert!(s.peak_rss() < 256 << 20, "{} MiB", s.peak_rss() >> 20);
}

#[test]
fn write_lat_with_fewer_buffers_than_connections_is_refused_not_a_panic() {
    let s = Server::start("write-lat", &[]);
    let mut evil = Peer::connect(s.port);
    evil.set_up("write-lat", 2, "127.0.0.1:9", 2);
    evil.send("METAROCE/2 go dst=1:2:4096 iters=1000 seed=1 size=2 slots=1000 src=1:2:4096");
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(
        said.contains("do not hold 1000 slots of 2 bytes for each of 2"),
        "{said}"
    );
    assert!(!s.log().contains("panicked"), "{}", s.log());
    s.serve_real_client("write-lat");
}

#[test]
fn lists_and_numbers_out_of_line_are_refused() {
    let s = Server::start("write-bw", &[]);
    // More queue pairs named than announced.
    let mut evil = Peer::connect(s.port);
    evil.set_up("write-bw", 1, "127.0.0.1:9", 3);
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(
        said.contains("the peer has 3 connections, this end 1"),
        "{said}"
    );
    // Numbers beyond their limits.
    for hello in [
        "qps=100000 paths=4 window=16",
        "qps=1 paths=200 window=16",
        "qps=1 paths=4 window=100000",
        "qps=1 paths=4 window=16 start_window=0",
        "qps=1 paths=4 window=16 start_window=4096",
        "qps=1 paths=4 window=16 start_window=x",
        "qps=1 paths=4 window=16 duration_ms=99999999999",
    ] {
        let mut evil = Peer::connect(s.port);
        evil.send(&format!(
            "METAROCE/2 hello busy=0 test=write-bw transport=udp workers=1 {hello}"
        ));
        let (said, _) = evil.until_closed(Duration::from_secs(10));
        assert!(said.contains("METAROCE/2 error"), "{hello}: {said}");
    }
    // Counts in done that do not match the connections.
    let mut evil = Peer::connect(s.port);
    evil.set_up("write-bw", 2, "127.0.0.1:9", 2);
    evil.send("METAROCE/2 go dst=1:2:65536,1:2:65536 iters=1 seed=1 size=65536 slots=1 src=1:2:65536,1:2:65536");
    let ready = evil.line(Duration::from_secs(10)).unwrap();
    assert!(ready.contains(" ready "), "{ready}");
    evil.send("METAROCE/2 done counts=1,2,3,x");
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(said.contains("counts"), "{said}");
    assert!(!s.log().contains("panicked"), "{}", s.log());
    s.serve_real_client("write-bw");
}

#[test]
fn data_redirected_to_another_host_is_refused() {
    let s = Server::start("write-bw", &[]);
    let mut evil = Peer::connect(s.port);
    evil.set_up("write-bw", 1, "127.0.0.2:4791", 1);
    let (said, _) = evil.until_closed(Duration::from_secs(10));
    assert!(
        said.contains(
            "asks for its data at 127.0.0.2:4791, but its control connection comes from 127.0.0.1"
        ),
        "{said}"
    );
    s.serve_real_client("write-bw");
}

/// SIGSTOP, then SIGKILL, a process.
fn signal(pid: u32, sig: &str) {
    Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
}

/// A client of a 60-second write-bw run.
fn long_client(port: u16, stderr: Stdio) -> Child {
    Command::new(bin())
        .args(["write-bw", "127.0.0.1", "-p", &port.to_string(), "-D", "60"])
        .args(["--data-port", "0"])
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap()
}

#[test]
fn a_peer_stopped_mid_run_ends_the_run_on_both_sides_within_seconds() {
    // The client stops: the server says so within seconds and waits for the next client.
    let s = Server::start("write-bw", &[]);
    let client = long_client(s.port, Stdio::null());
    std::thread::sleep(Duration::from_secs(2));
    signal(client.id(), "-STOP");
    let after = s.wait_for("lost the client", 1, Duration::from_secs(12));
    assert!(s.log().contains("sent nothing for 5 s"), "{}", s.log());
    assert!(after < Duration::from_secs(9), "{after:?}");
    signal(client.id(), "-KILL");
    let _ = wait(client, Duration::from_secs(5));
    s.serve_real_client("write-bw");
    // The server stops: the client ends with a clear error within seconds.
    let client = long_client(s.port, Stdio::piped());
    std::thread::sleep(Duration::from_secs(2));
    signal(s.pid(), "-STOP");
    let start = Instant::now();
    let out = wait(client, Duration::from_secs(15));
    let took = start.elapsed();
    signal(s.pid(), "-CONT");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("sent nothing for 5 s"), "{err}");
    assert!(took < Duration::from_secs(9), "{took:?}");
}

/// Threads of a process.
fn threads(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("Threads:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_failed_worker_leaves_no_thread_behind() {
    let s = Server::start("write-bw", &[]);
    let before = threads(s.pid());
    for round in 0..2 {
        let hello = |w: u32| {
            format!(
                "METAROCE/2 hello busy=0 paths=4 qps=1 test=write-bw transport=udp window=16 workers=2 session={} w={w}",
                100 + round
            )
        };
        let mut w0 = Peer::connect(s.port);
        w0.send(&hello(0));
        let mut w1 = Peer::connect(s.port);
        w1.send(&hello(1));
        // Worker 0 sends nonsense; worker 1 starts a phase and then only keeps its heartbeat.
        let h0 = w0.line(Duration::from_secs(10)).expect("hello 0");
        assert!(h0.contains(" hello "), "{h0}");
        w0.send("METAROCE/2 bogus");
        let h1 = w1.line(Duration::from_secs(10)).expect("hello 1");
        assert!(h1.contains("data=127.0.0.1:"), "{h1}");
        w1.send("METAROCE/2 qps data=127.0.0.1:9 qp=100:1:7");
        w1.send(
            "METAROCE/2 go dst=4096:1:65536 iters=1 seed=1 size=65536 slots=1 src=4096:1:65536",
        );
        let ready = w1.line(Duration::from_secs(10)).expect("ready");
        assert!(ready.contains(" ready "), "{ready}");
        let start = Instant::now();
        let mut alive = w1.stream.try_clone().unwrap();
        let beat = std::thread::spawn(move || {
            while start.elapsed() < Duration::from_secs(40) {
                if alive.write_all(b"METAROCE/2 alive\n").is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        });
        let (said, after) = w1.until_closed(Duration::from_secs(40));
        assert!(
            said.contains("the client sent no data and no done for 15 s"),
            "{said}"
        );
        assert!(after < Duration::from_secs(25), "{after:?}");
        drop(w1);
        beat.join().unwrap();
        s.wait_for("lost the client", round + 1, Duration::from_secs(5));
        assert!(
            threads(s.pid()) <= before,
            "threads {} > {before}",
            threads(s.pid())
        );
    }
    // The data port is free again for a client of one worker.
    s.serve_real_client("write-bw");
}

#[test]
fn an_empty_hello_or_a_reset_does_not_end_a_once_server() {
    let s = Server::start("write-bw", &["--once"]);
    let mut empty = Peer::connect(s.port);
    empty.send("METAROCE/2 hello");
    let (said, _) = empty.until_closed(Duration::from_secs(5));
    assert!(said.contains("hello lacks test"), "{said}");
    // A connection that holds the server while another one waits in the listen queue and
    // resets before it is taken.
    let holder = Peer::connect(s.port);
    let reset = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: the descriptor is the open socket `reset` owns; the option value is a live
    // `linger` whose size is passed with it.
    let r = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&reset),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0);
    drop(reset);
    drop(holder);
    s.wait_for(
        "a connection that was not a client",
        3,
        Duration::from_secs(15),
    );
    s.serve_real_client("write-bw");
}
