//! The UDP transport end to end as users run it: a `metaroce` server process and a client
//! process on loopback, IPv4 and IPv6, with every byte verified; the capture read by tshark;
//! the counters of running endpoints; errors a user meets.

mod common;

use common::{
    assert_success, bin, default_payload, loopback_mtu, pair, port, server_counter, ScratchDir,
};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// The frames of a capture that `metaroce decode` parses with `port` as the RoCEv2 port.
fn decode_capture(file: &std::path::Path, port: &str) -> Vec<serde_json::Value> {
    let dec = Command::new(bin())
        .args(["decode", "--json", "--port", port, "-r"])
        .arg(file)
        .output()
        .unwrap();
    String::from_utf8_lossy(&dec.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|f: &serde_json::Value| f.get("error").is_none())
        .collect()
}

#[test]
fn sixty_four_mib_of_writes_sends_and_reads_on_loopback_with_four_connections() {
    for test in ["write-bw", "send-bw", "read-bw"] {
        let p = pair(
            test,
            &[],
            &["--data-port", "0"],
            &[],
            &[
                "--json",
                "-s",
                "1048576",
                "-n",
                "16",
                "-q",
                "4",
                "--paths",
                "8",
                "--data-port",
                "0",
            ],
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        let r = &p.client_json()[0];
        assert_eq!(r["iterations"], 64, "{test}: {r}");
        assert_eq!(r["total_bytes"].as_u64(), Some(64 * MIB), "{test}");
        assert_eq!(r["verified"], true, "{test}");
        let s = p.server_json();
        assert_eq!(s["verified"], true, "{test}");
        if test != "read-bw" {
            assert_eq!(
                s["bytes_checked"].as_u64(),
                Some(64 * MIB),
                "{test}: server checked all"
            );
        }
        assert_eq!(s["stats"]["qps"].as_array().map(Vec::len), Some(4));
        assert_eq!(
            r["paths_used"], 8,
            "{test}: every connection sprayed over its 8 paths"
        );
        assert_eq!(server_counter(&p, "access_violations"), 0, "{test}");
    }
}

#[test]
fn ipv6_loopback() {
    if std::net::UdpSocket::bind("[::1]:0").is_err() {
        panic!("this machine has no IPv6 loopback; the IPv6 path cannot be tested here");
    }
    let scratch = ScratchDir::new("v6");
    let dir = &scratch.0;
    let file = dir.join("v6.pcap");
    // A free UDP port for the server's data, so the capture can be decoded by port.
    let data_port = std::net::UdpSocket::bind("[::1]:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let p = pair(
        "write-bw",
        &[],
        &["--data-port", &data_port],
        &[],
        &[
            "--json",
            "-s",
            "1048576",
            "-n",
            "16",
            "-q",
            "2",
            "--data-port",
            "0",
            "--pcap",
            file.to_str().unwrap(),
        ],
        "::1",
        &[],
    );
    assert_success(&p);
    let r = &p.client_json()[0];
    assert_eq!(r["verified"], true);
    assert_eq!(r["total_bytes"].as_u64(), Some(32 * MIB));
    let peer = p.server_json()["stats"]["qps"][0]["peer"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(peer.starts_with("[::1]:"), "{peer}");
    // The capture holds IPv6 frames whose ICRC (over the IPv6 header) checks out.
    let frames = decode_capture(&file, &data_port);
    let packets = 32 * MIB / default_payload(loopback_mtu(), false);
    assert!(
        frames.len() as u64 >= packets,
        "every data packet to the server ({packets}): {}",
        frames.len()
    );
    for f in &frames {
        assert!(f.get("ipv6").is_some(), "{f}");
        assert_eq!(f["icrc"]["ok"], true, "{f}");
    }
}

#[test]
fn the_capture_is_read_by_tshark_as_rocev2_and_by_decode_with_good_icrcs() {
    let scratch = ScratchDir::new("pcap");
    let dir = &scratch.0;
    let file = dir.join("client.pcap");
    // The server on the RoCEv2 port, so tshark dissects what the client sends it by port.
    let p = pair(
        "write-bw",
        &[],
        &[],
        &[],
        &[
            "--json",
            "-s",
            "40000",
            "-n",
            "50",
            "--paths",
            "4",
            "--data-port",
            "0",
            "--pcap",
            file.to_str().unwrap(),
        ],
        "127.0.0.1",
        &[],
    );
    assert_success(&p);
    let out = Command::new("tshark")
        .args(["-r", file.to_str().unwrap(), "-Y", "udp.dstport == 4791"])
        .args([
            "-T",
            "fields",
            "-E",
            "separator=/t",
            "-e",
            "udp.srcport",
            "-e",
            "infiniband.bth.opcode",
            "-e",
            "infiniband.bth.destqp",
            "-e",
            "infiniband.bth.psn",
        ])
        .output()
        .expect("tshark is installed by scripts/test.sh");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split('\t').collect()).collect();
    // Payloads of the loopback default (16 KiB, not a RoCE MTU) are dissected as any RoCEv2
    // packet; a 40000-byte Write is First, Middle and Last packets.
    let per_write = 40_000u64.div_ceil(default_payload(loopback_mtu(), true));
    assert!(
        rows.len() as u64 >= 50 * per_write,
        "every 40000-byte Write is {per_write} packets: {} rows",
        rows.len()
    );
    let qpn = p.server_json()["stats"]["qps"][0]["qpn"].as_u64().unwrap();
    let mut ports = std::collections::BTreeSet::new();
    for r in &rows {
        assert_eq!(r.len(), 4, "tshark found a BTH in every datagram: {r:?}");
        let destqp = u64::from_str_radix(r[2].trim_start_matches("0x"), 16).unwrap();
        assert_eq!(destqp, qpn, "addressed to the server's queue pair");
        ports.insert(r[0].to_string());
    }
    // One UDP source port per path; a path declared failed on a loaded machine takes a new one.
    let failures = p.client_json()[0]["path_failures"].as_u64().unwrap() as usize;
    assert!(
        (4..=4 + failures).contains(&ports.len()),
        "one UDP source port per path ({failures} path failures): {ports:?}"
    );
    // Our decoder reads every frame of the capture, both directions, with a good ICRC: what
    // went to the server on port 4791, and what came back to the client's data port.
    let client_port = p.server_json()["stats"]["qps"][0]["peer"]
        .as_str()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let to_server = decode_capture(&file, "4791");
    let to_client = decode_capture(&file, &client_port);
    assert_eq!(to_server.len(), rows.len());
    assert!(
        !to_client.is_empty(),
        "the capture holds what was received too"
    );
    let total = Command::new("tshark")
        .args(["-r", file.to_str().unwrap()])
        .output()
        .unwrap();
    let frames = String::from_utf8_lossy(&total.stdout).lines().count();
    assert_eq!(
        to_server.len() + to_client.len(),
        frames,
        "every frame decodes"
    );
    for f in to_server.iter().chain(&to_client) {
        assert_eq!(f["icrc"]["ok"], true, "{f}");
    }
}

#[test]
fn stats_shows_running_endpoints() {
    let scratch = ScratchDir::new("run");
    // A directory the tools create themselves: the scratch directory is open to others (0755)
    // and would be refused.
    let dir = scratch.0.join("stats");
    let dir_s = dir.to_str().unwrap().to_string();
    let env = [("METAROCE_RUN_DIR", dir_s.as_str())];
    let watcher = {
        let dir_s = dir_s.clone();
        std::thread::spawn(move || {
            // Poll `metaroce stats` while the two processes run.
            let end = Instant::now() + Duration::from_secs(20);
            while Instant::now() < end {
                let out = Command::new(bin())
                    .args(["stats", "--json"])
                    .env("METAROCE_RUN_DIR", &dir_s)
                    .output()
                    .unwrap();
                let snaps: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .filter_map(|l| serde_json::from_str(l).ok())
                    .collect();
                let busy = snaps.iter().filter(|s| {
                    s["qps"][0]["counters"]["tx_data_packets"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
                        || s["qps"][0]["counters"]["rx_data_packets"]
                            .as_u64()
                            .unwrap_or(0)
                            > 0
                });
                if busy.count() == 2 {
                    let text = Command::new(bin())
                        .args(["stats"])
                        .env("METAROCE_RUN_DIR", &dir_s)
                        .output()
                        .unwrap();
                    return Some((snaps, String::from_utf8_lossy(&text.stdout).into_owned()));
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
    };
    let p = pair(
        "write-bw",
        &[],
        &["--data-port", "0"],
        &[],
        &["--json", "-D", "3", "--data-port", "0"],
        "127.0.0.1",
        &env,
    );
    assert_success(&p);
    let (snaps, text) = watcher
        .join()
        .unwrap()
        .expect("stats saw both endpoints at work");
    for s in &snaps {
        let q = &s["qps"][0];
        assert!(q["paths"].as_array().unwrap().len() == 8);
        for k in [
            "retransmits",
            "sacked",
            "ecn_ce_received",
            "rx_drop_wrong_pkey",
        ] {
            assert!(q["counters"][k].is_u64(), "{k} in {q}");
        }
        let dev = &s["device"];
        assert!(dev["tx_packets"].as_u64().unwrap() + dev["rx_packets"].as_u64().unwrap() > 0);
    }
    assert!(
        text.contains("statistics:") && text.contains("retransmits: ") && text.contains("rtt_min"),
        "{text}"
    );
    // Finished endpoints take their files with them.
    let out = Command::new(bin())
        .args(["stats"])
        .env("METAROCE_RUN_DIR", &dir_s)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no running endpoint"));
}

#[test]
fn stats_refuses_an_open_directory_and_warns_of_an_oversized_file() {
    use std::os::unix::fs::PermissionsExt;
    let scratch = ScratchDir::new("stats-dir");
    let dir = scratch.0.join("stats");
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o775)).unwrap();
    let stats = || {
        Command::new(bin())
            .args(["stats"])
            .env("METAROCE_RUN_DIR", &dir)
            .output()
            .unwrap()
    };
    let out = stats();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "refusing the stats directory {}: mode 0775",
            dir.display()
        )),
        "{err}"
    );
    // Private now; a file too large for a snapshot, named after a live process (this one).
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let big = dir.join(format!("{}.json", std::process::id()));
    std::fs::write(&big, vec![b' '; 2 << 20]).unwrap();
    let out = stats();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "warning: skipping {}: 2097152 bytes",
            big.display()
        )) && err.contains("no running endpoint"),
        "{err}"
    );
}

#[test]
fn a_refused_connection_and_a_foreign_version_are_named() {
    let port = port();
    let out = Command::new(bin())
        .args(["write-bw", "127.0.0.1", "-p", &port.to_string()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("127.0.0.1:{port} refused the connection")),
        "{err}"
    );

    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let lport = l.local_addr().unwrap().port();
    let fake = std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut r = BufReader::new(s.try_clone().unwrap());
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        (&s).write_all(b"METAROCE/9 hello\n").unwrap();
        line
    });
    let out = Command::new(bin())
        .args([
            "write-bw",
            "127.0.0.1",
            "-p",
            &lport.to_string(),
            "--data-port",
            "0",
        ])
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let hello = fake.join().unwrap();
    assert!(hello.starts_with("METAROCE/2 hello "), "{hello}");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the peer speaks exchange version 9, this build speaks 2"),
        "{err}"
    );
}

#[test]
fn devices_lists_the_loopback_interface() {
    let out = Command::new(bin())
        .args(["devices", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lo = v["udp"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["loopback"] == true)
        .expect("loopback listed");
    assert!(lo["addrs"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a == "127.0.0.1"));
    // Without a device (this machine has none) the verbs side says why.
    assert!(v["verbs"]["error"].is_string() || v["verbs"].is_array());
}

#[test]
fn latency_tests_over_processes() {
    for test in ["write-lat", "send-lat", "read-lat"] {
        let p = pair(
            test,
            &[],
            &["--data-port", "0"],
            &[],
            &["--json", "-n", "500", "-s", "64", "--data-port", "0"],
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        let r = &p.client_json()[0];
        assert_eq!(r["iterations"], 500);
        assert_eq!(r["verified"], true);
        for k in [
            "t_min_us", "t_avg_us", "p50_us", "p99_us", "p999_us", "t_max_us",
        ] {
            assert!(r[k].as_f64().unwrap() > 0.0, "{test} {k}");
        }
    }
}

/// Ping-pongs whose ends sleep until something arrives (`-e`, both ends): each answer carries
/// the ACK of its ping. A woken end hands what arrived to the tool before it sends an ACK; it
/// used to send the ACK first, on its own (488-717 of 5,000 answers carried it, and write-lat's
/// p50 was about 50 us instead of about 20 on a 2-vCPU machine).
#[test]
fn sleeping_ping_pongs_carry_their_acks_in_the_answers() {
    for test in ["write-lat", "send-lat"] {
        let p = pair(
            test,
            &[],
            &["-e", "--data-port", "0"],
            &[],
            &["--json", "-n", "1000", "-s", "64", "-e", "--data-port", "0"],
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        assert_eq!(p.client_json()[0]["verified"], true);
        let carried = server_counter(&p, "acks_piggybacked");
        assert!(
            carried >= 950,
            "{test}: {carried} of 1,000 answers carried the ping's ACK"
        );
    }
}

/// `metaroce atomic-bw` and `atomic-lat` between two processes, each atomic's original value and
/// the peer's final word checked; -A names perftest's operations, and a wrong size is refused.
#[test]
fn atomic_tests_over_processes() {
    for (test, op) in [
        ("atomic-bw", "FETCH_AND_ADD"),
        ("atomic-bw", "CMP_AND_SWAP"),
        ("atomic-lat", "FETCH_AND_ADD"),
        ("atomic-lat", "CMP_AND_SWAP"),
    ] {
        let p = pair(
            test,
            &[],
            &["--data-port", "0"],
            &[],
            &["--json", "-n", "1000", "-A", op, "--data-port", "0"],
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        let r = &p.client_json()[0];
        assert_eq!(r["bytes"], 8, "{test} {op}");
        assert_eq!(r["iterations"], 1000, "{test} {op}");
        assert_eq!(r["verified"], true, "{test} {op}");
    }
    let out = std::process::Command::new(bin())
        .args(["atomic-bw", "127.0.0.1", "-s", "64", "-p", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("8 bytes"));
    let out = std::process::Command::new(bin())
        .args(["write-bw", "127.0.0.1", "-A", "CMP_AND_SWAP", "-p", "1"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("-A applies to atomic"));
}

/// perftest's -o: Reads and atomics with one and two outstanding at most (the initiator depth)
/// move every byte and every atomic's value right, requests waited for the depth (the tools
/// keep 16 and more in flight), and the responder never had to refuse one for want of room (no
/// receiver-not-ready retries); 0 is refused.
#[test]
fn outstanding_reads_and_atomics_are_capped_by_outs() {
    for (test, extra, outs) in [
        ("read-bw", &["-s", "65536", "-n", "256"][..], "1"),
        ("read-bw", &["-s", "65536", "-n", "256"][..], "2"),
        ("atomic-bw", &["-n", "500"][..], "1"),
        ("atomic-bw", &["-n", "500", "-A", "CMP_AND_SWAP"][..], "2"),
    ] {
        let mut args = vec!["--json", "--data-port", "0", "-o", outs];
        args.extend_from_slice(extra);
        let p = pair(
            test,
            &[],
            &["--data-port", "0"],
            &[],
            &args,
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        let r = &p.client_json()[0];
        assert_eq!(r["verified"], true, "{test} -o {outs}: {r}");
        assert_eq!(r["rnr_retries"], 0, "{test} -o {outs}: {r}");
        assert!(
            r["requests_waited"].as_u64().is_some_and(|w| w > 0),
            "{test} -o {outs}: {r}"
        );
    }
    let out = std::process::Command::new(bin())
        .args(["read-bw", "127.0.0.1", "-o", "0", "-p", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--outs"));
}

/// perftest's -H and -U: every sample, sorted (and first in the order measured with -U),
/// before the summary line; with --json a `samples_us` array in the order measured, whose
/// extremes and median are the summary's.
#[test]
fn every_sample_is_reported_when_asked() {
    let lat = |args: &[&str], json: bool| {
        let mut a = args.to_vec();
        a.extend(["--data-port", "0"]);
        if json {
            a.push("--json");
        }
        let p = pair(
            "write-lat",
            &[],
            &["--data-port", "0"],
            &[],
            &a,
            "127.0.0.1",
            &[],
        );
        assert_success(&p);
        p
    };
    let p = lat(&["-n", "300", "-U"], true);
    let r = &p.client_json()[0];
    let samples: Vec<f64> = r["samples_us"]
        .as_array()
        .expect("samples_us")
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(samples.len(), 300);
    let mut sorted = samples.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(sorted[0], r["t_min_us"].as_f64().unwrap());
    assert_eq!(sorted[299], r["t_max_us"].as_f64().unwrap());
    assert_eq!(sorted[149], r["p50_us"].as_f64().unwrap());
    assert_eq!(sorted[296], r["p99_us"].as_f64().unwrap());

    let p = lat(&["-n", "200", "-U"], false);
    let out = String::from_utf8_lossy(&p.client.stdout).into_owned();
    let blocks: Vec<Vec<f64>> = out
        .split("#, usec\n")
        .skip(1)
        .map(|b| {
            b.lines()
                .map_while(|l| {
                    let (i, v) = l.split_once(", ")?;
                    i.parse::<usize>().ok()?;
                    v.parse::<f64>().ok()
                })
                .collect()
        })
        .collect();
    assert_eq!(blocks.len(), 2, "{out}");
    assert_eq!((blocks[0].len(), blocks[1].len()), (200, 200), "{out}");
    assert!(blocks[1].windows(2).all(|w| w[0] <= w[1]), "sorted");
    let mut first = blocks[0].clone();
    first.sort_by(f64::total_cmp);
    assert_eq!(first, blocks[1], "the same samples");
    // The summary line follows, its t_min the smallest sample.
    let last = out
        .lines()
        .rev()
        .find(|l| l.starts_with(" 2 "))
        .expect(&out);
    let t_min: f64 = last.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!(
        (t_min - blocks[1][0]).abs() < 0.006,
        "{last} vs {}",
        blocks[1][0]
    );

    // Without -H nothing more is printed; bandwidth tests refuse it.
    let p = lat(&["-n", "50"], true);
    assert!(p.client_json()[0].get("samples_us").is_none());
    let out = Command::new(bin())
        .args(["write-bw", "127.0.0.1", "-H"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("apply to latency tests"));
}

#[test]
fn the_device_flag_names_an_interface() {
    let p = pair(
        "send-bw",
        &[],
        &["--data-port", "0"],
        &[],
        &[
            "--json",
            "-d",
            "lo",
            "-n",
            "100",
            "-s",
            "4096",
            "--data-port",
            "0",
        ],
        "127.0.0.1",
        &[],
    );
    assert_success(&p);
    assert_eq!(p.client_json()[0]["verified"], true);
    let out = Command::new(bin())
        .args(["write-bw", "127.0.0.1", "-d", "no-such-if0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no interface \"no-such-if0\" with an IP address"),
        "{err}"
    );
}
