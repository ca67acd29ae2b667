//! Helpers shared by the integration tests: the test data, scratch directories and the independent
//! tools the interop tests run (scapy in the project's virtual environment, tshark).
//!
//! The interop tests are `#[ignore]`d so that a bare `cargo test` on a machine without the tools
//! reports them as ignored rather than passing them unseen; `scripts/test.sh` installs the tools and
//! runs them with `--include-ignored`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The repository's top directory.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ has a parent")
        .to_path_buf()
}

/// A file under `tests/data`.
pub fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("data")
        .join(name)
}

/// A fresh scratch directory for one test.
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("metaroce-tests-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch directory");
    dir
}

/// Decodes a hex string.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// The frames of a `.hex` vector file (comment lines start with '#').
pub fn hex_frames(path: &Path) -> Vec<Vec<u8>> {
    std::fs::read_to_string(path)
        .expect("read vector file")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(unhex)
        .collect()
}

/// The Python interpreter of the virtual environment that holds scapy: `$METAROCE_PYTHON`, or
/// `.venv/bin/python` at the top of the repository. Panics with a clear message when neither
/// exists: the interop tests need it and must not pass without it.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("METAROCE_PYTHON") {
        return PathBuf::from(p);
    }
    let p = repo_root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "scapy's virtual environment is missing: run scripts/test.sh (it creates .venv) or set METAROCE_PYTHON"
    );
    p
}

/// Runs a Python script from `tests/py` and returns its standard output.
pub fn run_python(script: &str, args: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("py")
        .join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
    assert!(
        out.status.success(),
        "{script} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("utf-8 output")
}

/// The heuristic dissectors that may claim an InfiniBand payload (and so swallow the ICRC).
const HEURISTICS: &[&str] = &[
    "eth_over_ib",
    "fc_infiniband",
    "sdp_infiniband",
    "iser_infiniband",
    "lnet_ib",
    "rpcrdma_infiniband",
    "smb_direct_infiniband",
    "smcr_infiniband",
    "nvme_rdma",
    "nvme_rdma_cm_private",
    "drbd_rdma",
    "mellanox_eoib",
];

/// Runs tshark over a capture and returns, per frame, the first occurrence of each field
/// (absent fields are left out).
pub fn tshark_fields(pcap: &Path, fields: &[&str]) -> Vec<HashMap<String, String>> {
    let mut cmd = Command::new("tshark");
    for h in HEURISTICS {
        cmd.args(["--disable-heuristic", h]);
    }
    cmd.arg("-r")
        .arg(pcap)
        .args(["-T", "fields", "-E", "separator=/t", "-E", "occurrence=f"]);
    for f in fields {
        cmd.args(["-e", f]);
    }
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("tshark is not installed or cannot run ({e}): scripts/test.sh installs it")
    });
    assert!(
        out.status.success(),
        "tshark failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf-8 output")
        .lines()
        .map(|line| {
            fields
                .iter()
                .zip(line.split('\t'))
                .filter(|(_, v)| !v.is_empty())
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        })
        .collect()
}

/// A number as tshark prints it: decimal, `0x` hex, or a boolean.
pub fn tshark_number(v: &str) -> u64 {
    match v {
        "True" => 1,
        "False" => 0,
        _ => match v.strip_prefix("0x") {
            Some(h) => u64::from_str_radix(h, 16).unwrap_or_else(|_| panic!("bad hex {v}")),
            None => v.parse().unwrap_or_else(|_| panic!("bad number {v}")),
        },
    }
}
