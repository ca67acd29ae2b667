//! The `metaroce` binary as users run it: `gen` piped into `decode`, pcap files both ways, bad
//! input reported per frame while decoding goes on.

use serde_json::Value;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn metaroce(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_metaroce"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run metaroce");
    let mut pipe = child.stdin.take().expect("stdin");
    let input = stdin.unwrap_or_default().to_vec();
    // Feed standard input from another thread so that a full stdout pipe cannot deadlock us.
    let feeder = std::thread::spawn(move || pipe.write_all(&input));
    let out = child.wait_with_output().expect("metaroce finishes");
    feeder.join().expect("feeder thread").expect("write stdin");
    out
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
        .collect()
}

fn vectors() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/rocev2-connectx.pcap")
}

#[test]
fn gen_piped_into_decode() {
    for kind in ["rocev2", "metaroce", "mixed"] {
        let gen = metaroce(
            &["gen", "--count", "300", "--seed", "9", "--kind", kind],
            None,
        );
        assert!(gen.status.success());
        assert_eq!(gen.stdout.iter().filter(|&&b| b == b'\n').count(), 300);
        let dec = metaroce(&["decode", "--json"], Some(&gen.stdout));
        assert!(
            dec.status.success(),
            "{}",
            String::from_utf8_lossy(&dec.stderr)
        );
        let frames = json_lines(&dec);
        assert_eq!(frames.len(), 300);
        for f in &frames {
            assert_eq!(f["icrc"]["ok"], Value::Bool(true), "{f}");
            let op = f["bth"]["opcode"].as_u64().unwrap();
            match kind {
                "rocev2" => assert!(op < 0xc0, "{f}"),
                "metaroce" => assert!(op >= 0xc0, "{f}"),
                _ => {}
            }
        }
        let text = metaroce(&["decode"], Some(&gen.stdout));
        assert!(text.status.success());
        let text = String::from_utf8_lossy(&text.stdout);
        assert_eq!(text.matches("frame ").count(), 300);
        assert!(text.contains("BTH") && text.contains("ok=true"));
    }
}

#[test]
fn same_seed_same_frames() {
    let a = metaroce(&["gen", "-n", "50", "-s", "42"], None);
    let b = metaroce(&["gen", "-n", "50", "-s", "42"], None);
    let c = metaroce(&["gen", "-n", "50", "-s", "43"], None);
    assert_eq!(a.stdout, b.stdout);
    assert_ne!(a.stdout, c.stdout);
}

#[test]
fn pcap_out_and_in() {
    let dir = std::env::temp_dir().join(format!("metaroce-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pcap = dir.join("gen.pcap");
    let out = metaroce(
        &[
            "gen",
            "-n",
            "40",
            "-s",
            "5",
            "--pcap",
            pcap.to_str().unwrap(),
        ],
        None,
    );
    assert!(out.status.success());
    let from_pcap = json_lines(&metaroce(
        &["decode", "--json", "-r", pcap.to_str().unwrap()],
        None,
    ));
    let hex = metaroce(&["gen", "-n", "40", "-s", "5"], None);
    let from_hex = json_lines(&metaroce(&["decode", "--json"], Some(&hex.stdout)));
    assert_eq!(from_pcap, from_hex);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn real_connectx_capture_decodes() {
    let out = metaroce(
        &["decode", "--json", "--pcap", vectors().to_str().unwrap()],
        None,
    );
    assert!(out.status.success());
    let frames = json_lines(&out);
    assert_eq!(frames.len(), 8);
    assert!(frames.iter().all(|f| f["icrc"]["ok"] == Value::Bool(true)));
    assert_eq!(frames[0]["bth"]["opcode"], 0x81);
    assert_eq!(frames[0]["bth"]["dest_qp"], 0x118);
    assert_eq!(frames[4]["aeth"]["msn"], 2);
    assert_eq!(frames[1]["deth"]["qkey"], 0x8001_0000u64);
}

#[test]
fn bad_frames_are_reported_and_decoding_goes_on() {
    let good = "e41d2dab2bc27cfe90643b32080045c2003c718c4000401191610a0011010a001201000012b7002800008100ffff40000118000000000000000000000000000000000000000082fd002a";
    let mut bad_icrc = good.to_string();
    bad_icrc.replace_range(bad_icrc.len() - 2.., "2b");
    let truncated = &good[..60];
    let input = format!("# a comment\n{good}\n\nzz\n{truncated}\n{bad_icrc}\n{good}\n");
    let out = metaroce(&["decode", "--json"], Some(input.as_bytes()));
    assert_eq!(
        out.status.code(),
        Some(1),
        "an unparseable frame makes the exit status 1"
    );
    let frames = json_lines(&out);
    assert_eq!(frames.len(), 5);
    assert_eq!(frames[0]["icrc"]["ok"], Value::Bool(true));
    assert!(frames[1]["error"].as_str().unwrap().contains("invalid hex"));
    assert!(
        frames[2]["error"].as_str().unwrap().contains("truncated"),
        "{}",
        frames[2]
    );
    assert_eq!(frames[3]["icrc"]["ok"], Value::Bool(false));
    assert_eq!(frames[4]["icrc"]["ok"], Value::Bool(true));
    assert_eq!(frames[4]["frame"], 5);
}

#[test]
fn not_a_capture_is_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("metaroce-cli-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("junk.pcap");
    std::fs::write(&path, b"this is not a capture").unwrap();
    let out = metaroce(&["decode", "-r", path.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a pcap or pcapng file"));
    let missing = metaroce(&["decode", "-r", "/nonexistent/x.pcap"], None);
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/x.pcap"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn selftest_prints_the_promised_keys_and_exits_by_the_result() {
    let out = metaroce(
        &[
            "selftest",
            "--bytes",
            "4MiB",
            "--paths",
            "8",
            "--loss",
            "0.05",
            "--reorder",
            "0.2",
            "--dup",
            "0.01",
            "--corrupt",
            "0.001",
            "--seed",
            "7",
            "--fail-path",
            "3",
            "--fail-at",
            "100us",
            "--ops",
            "mixed",
            "--json",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = &json_lines(&out)[0];
    for key in [
        "bytes_posted",
        "bytes_delivered",
        "bytes_verified",
        "duplicates_delivered",
        "goodput_fraction",
        "retransmits_per_loss",
        "failover_stall_rtts",
        "virtual_time_us",
    ] {
        assert!(
            v.get(key).is_some_and(Value::is_number),
            "missing {key}: {v}"
        );
    }
    assert_eq!(v["bytes_posted"], 4 << 20);
    assert_eq!(v["bytes_verified"], 4 << 20);
    assert_eq!(v["duplicates_delivered"], 0);
    let text = metaroce(&["selftest", "--bytes", "1MiB"], None);
    assert!(text.status.success());
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("bytes verified equal  1048576") && text.contains("result                OK"),
        "{text}"
    );
    let bad = metaroce(&["selftest", "--loss", "1.5"], None);
    assert_eq!(bad.status.code(), Some(2));
    let bad = metaroce(&["selftest", "--paths", "4", "--fail-path", "4"], None);
    assert_eq!(bad.status.code(), Some(2));
    let bad = metaroce(&["selftest", "--bytes", "12XB"], None);
    assert!(!bad.status.success());
    for burst in ["8", "flight"] {
        let runs = metaroce(
            &[
                "selftest", "--bytes", "2MiB", "--loss", "0.05", "--burst", burst, "--json",
            ],
            None,
        );
        assert!(runs.status.success(), "--burst {burst}");
        let v: serde_json::Value = serde_json::from_slice(&runs.stdout).expect("one JSON object");
        assert_eq!(v["bytes_verified"], 2 << 20);
        assert!(v["data_packets_lost"].as_u64().unwrap() > 0, "{v}");
    }
    for bad_burst in ["0", "many", "5000"] {
        let bad = metaroce(&["selftest", "--burst", bad_burst], None);
        assert_eq!(bad.status.code(), Some(2), "--burst {bad_burst}");
        assert!(
            String::from_utf8_lossy(&bad.stderr).contains("is not a burst"),
            "--burst {bad_burst}"
        );
    }
}

#[test]
fn selftest_runs_an_incast_and_reports_its_fields() {
    let out = metaroce(
        &["selftest", "--senders", "4", "--bytes", "200KB", "--json"],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["senders"], 4);
    assert_eq!(v["cc"], "metaroce");
    assert_eq!(v["ok"], true);
    assert_eq!(v["per_sender_goodput"].as_array().map(Vec::len), Some(4));
    for k in [
        "jain_index",
        "link_utilisation",
        "max_queue_bytes",
        "drops",
        "settle_rtts",
    ] {
        assert!(v.get(k).is_some(), "{k} missing: {v}");
    }
    let bad = metaroce(&["selftest", "--senders", "4", "--pmax", "2"], None);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let bad = metaroce(&["selftest", "--senders", "0"], None);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
}

/// `metaroce devices` lists each port's GID table with types, as `show_gids` does, and marks
/// the GID the verbs backend takes by default (read from a copy of the sysfs layout).
#[test]
fn devices_lists_gid_tables_and_the_default() {
    let sysfs = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../host-ibverbs/tests/fixtures/sysfs-infiniband");
    let sysfs = sysfs.to_str().unwrap();
    let out = metaroce(&["devices", "--json", "--sysfs", sysfs], None);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let dev = |name: &str| {
        v["rdma"]
            .as_array()
            .unwrap()
            .iter()
            .find(|d| d["name"] == name)
            .unwrap()["ports"][0]
            .clone()
    };
    let p = dev("mlx5_0");
    assert_eq!(p["link_layer"], "Ethernet");
    assert_eq!(p["active"], true);
    assert_eq!(p["best_gid_index"], 3);
    assert_eq!(p["gids"][3]["ipv4"], "192.168.10.21");
    assert_eq!(p["gids"][3]["type"], "RoCE v2");
    assert_eq!(p["gids"][2]["type"], "IB/RoCE v1");
    assert_eq!(p["gids"].as_array().unwrap().len(), 6);
    assert_eq!(
        (p["mtu"].as_u64(), p["roce_mtu"].as_u64()),
        (Some(9000), Some(4096))
    );
    // No default on an InfiniBand port; a down port says so.
    assert_eq!(dev("mlx5_1")["best_gid_index"], Value::Null);
    assert_eq!(dev("mlx5_2")["active"], false);
    let out = metaroce(&["devices", "--sysfs", sysfs], None);
    let text = String::from_utf8(out.stdout).unwrap();
    let row = text
        .lines()
        .find(|l| l.contains("::ffff:192.168.10.21") && l.contains("RoCE v2"))
        .unwrap();
    assert!(
        row.contains("<- default") && row.contains("enp65s0f0"),
        "{text}"
    );
    assert!(
        text.contains("mlx5_1 port 1: 4: ACTIVE, InfiniBand"),
        "{text}"
    );
}
