//! Running a `metaroce` server and client as separate processes, optionally inside network
//! namespaces, with a deadline.

#![allow(dead_code)]

use serde_json::Value;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

/// A directory of its own under the system's temporary directory, removed when dropped (also
/// when the test fails).
pub struct ScratchDir(pub std::path::PathBuf);

impl ScratchDir {
    pub fn new(tag: &str) -> ScratchDir {
        let dir = std::env::temp_dir().join(format!("metaroce-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        ScratchDir(dir)
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

/// The binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_metaroce")
}

static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// A TCP port for the exchange, distinct per test in this process, and below the kernel's
/// ephemeral range (32768 and up by default), where outgoing connections of anything on the host
/// take ports: from 20000 up, the servers of two runs of the README's test command failed on
/// "Address already in use".
pub fn port() -> u16 {
    let base = 12000 + (std::process::id() % 500) as u16 * 40;
    base + NEXT_PORT.fetch_add(1, Ordering::Relaxed) % 40
}

/// Waits for a child with a deadline; kills it when the deadline passes.
pub fn wait(mut child: Child, limit: Duration) -> Output {
    let end = Instant::now() + limit;
    loop {
        match child.try_wait().expect("try_wait") {
            Some(_) => return child.wait_with_output().expect("output"),
            None if Instant::now() > end => {
                let _ = child.kill();
                let out = child.wait_with_output().expect("output");
                panic!(
                    "metaroce did not finish in {limit:?}\nstdout: {}\nstderr: {}",
                    String::from_utf8_lossy(&out.stdout),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// A server and a client run to completion.
pub struct Pair {
    /// The client's output.
    pub client: Output,
    /// The server's output (stderr lines before the "Waiting" banner included).
    pub server: Output,
}

impl Pair {
    /// The client's JSON result lines.
    pub fn client_json(&self) -> Vec<Value> {
        json_lines(&self.client)
    }

    /// The server's final JSON line.
    pub fn server_json(&self) -> Value {
        json_lines(&self.server).pop().unwrap_or_else(|| {
            panic!(
                "server printed no JSON; stderr: {}",
                String::from_utf8_lossy(&self.server.stderr)
            )
        })
    }
}

/// Parses every stdout line as JSON.
pub fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
        .collect()
}

/// Runs `metaroce <test>` as a server (behind `server_prefix`, e.g. `ip netns exec b`; it prints
/// JSON) and as a client of `server_addr` (behind `client_prefix`), each with its extra arguments
/// (the client's `--json` among them for JSON lines, without it perftest's table).
pub fn pair(
    test: &str,
    server_prefix: &[&str],
    server_args: &[&str],
    client_prefix: &[&str],
    client_args: &[&str],
    server_addr: &str,
    env: &[(&str, &str)],
) -> Pair {
    pair_during(
        test,
        (server_prefix, server_args),
        (client_prefix, client_args),
        server_addr,
        env,
        |_, _| {},
    )
}

/// As [`pair`], with `during` run on a thread of its own while the client runs: it is given the
/// server's process id (a prefix such as `ip netns exec` executes the server in its own place)
/// and a flag set once the client has exited; the server is waited for after `during` returns.
pub fn pair_during(
    test: &str,
    (server_prefix, server_args): (&[&str], &[&str]),
    (client_prefix, client_args): (&[&str], &[&str]),
    server_addr: &str,
    env: &[(&str, &str)],
    during: impl FnOnce(u32, &std::sync::atomic::AtomicBool) + Send + 'static,
) -> Pair {
    let spawn = |prefix: &[&str], args: Vec<&str>| {
        let mut cmd = if prefix.is_empty() {
            Command::new(bin())
        } else {
            let mut c = Command::new(prefix[0]);
            c.args(&prefix[1..]).arg(bin());
            c
        };
        cmd.arg(test)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd.spawn().expect("spawn metaroce")
    };
    // The exchange port is picked per test; another process may hold it (these ports overlap
    // the kernel's ephemeral range): then the server says so, and the next one is tried.
    let mut attempt = 0;
    let (port, server, mut stderr, mut early) = loop {
        let port = port().to_string();
        let mut sargs = vec!["-p", port.as_str(), "--json", "--once"];
        sargs.extend_from_slice(server_args);
        let mut server = spawn(server_prefix, sargs);
        // Wait for the banner, keeping what came before it.
        let mut stderr = BufReader::new(server.stderr.take().expect("stderr"));
        let mut early = String::new();
        let ready = loop {
            let mut line = String::new();
            if stderr.read_line(&mut line).unwrap_or(0) == 0 {
                break false;
            }
            early.push_str(&line);
            if line.contains("Waiting for client") {
                break true;
            }
        };
        if ready {
            break (port, server, stderr, early);
        }
        let out = wait(server, Duration::from_secs(5));
        attempt += 1;
        if !(early.contains("Address already in use") && attempt < 8) {
            panic!(
                "server exited early: {early}{}",
                String::from_utf8_lossy(&out.stdout)
            );
        }
    };
    let rest = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });
    let mut cargs = vec![server_addr, "-p", port.as_str()];
    cargs.extend_from_slice(client_args);
    /// The thread beside the pair: dropped (also when the client's deadline panics), it sets the
    /// flag and joins the thread, so that `during` has ended (and has let the server run) before
    /// anything else happens.
    struct Beside {
        done: std::sync::Arc<std::sync::atomic::AtomicBool>,
        side: Option<std::thread::JoinHandle<()>>,
    }
    impl Drop for Beside {
        fn drop(&mut self) {
            self.done.store(true, Ordering::Relaxed);
            if let Some(side) = self.side.take() {
                let joined = side.join();
                if !std::thread::panicking() {
                    joined.expect("the thread beside the pair");
                }
            }
        }
    }
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let beside = Beside {
        done: done.clone(),
        side: Some({
            let pid = server.id();
            std::thread::spawn(move || during(pid, &done))
        }),
    };
    let client = wait(spawn(client_prefix, cargs), Duration::from_secs(180));
    drop(beside);
    let mut server = wait(server, Duration::from_secs(30));
    early.push_str(&rest.join().unwrap_or_default());
    server.stderr = early.into_bytes();
    Pair { client, server }
}

/// Panics with both outputs unless both processes succeeded.
pub fn assert_success(p: &Pair) {
    assert!(
        p.client.status.success() && p.server.status.success(),
        "client {:?}: {}{}\nserver {:?}: {}{}",
        p.client.status,
        String::from_utf8_lossy(&p.client.stdout),
        String::from_utf8_lossy(&p.client.stderr),
        p.server.status,
        String::from_utf8_lossy(&p.server.stdout),
        String::from_utf8_lossy(&p.server.stderr),
    );
}

/// Sums a connection counter over the server's queue pairs.
pub fn server_counter(p: &Pair, name: &str) -> u64 {
    p.server_json()["stats"]["qps"]
        .as_array()
        .expect("qps")
        .iter()
        .map(|q| q["counters"][name].as_u64().unwrap_or(0))
        .sum()
}

/// A device counter of the server.
pub fn server_device_counter(p: &Pair, name: &str) -> u64 {
    p.server_json()["stats"]["device"][name]
        .as_u64()
        .unwrap_or(0)
}

/// The tools' default payload per packet on an interface of MTU `link`
/// (`host_ibverbs::perf::payload_for`), bytes.
pub fn default_payload(link: u32, ipv4: bool) -> u64 {
    u64::from(host_ibverbs::perf::payload_for(None, link, ipv4).expect("a usable MTU"))
}

/// Loopback's MTU (65536 unless someone changed it).
pub fn loopback_mtu() -> u32 {
    std::fs::read_to_string("/sys/class/net/lo/mtu")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(65_536)
}
