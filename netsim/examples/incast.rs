//! Prints the incast report for N senders and each controller: `cargo run --release -p netsim
//! --example incast -- [N] [BYTES]`.

use netsim::incast::{run, IncastConfig};
use transport_core::rate::{Algorithm, DcqcnParams, SwiftParams, TimelyParams};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let n: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(16);
    let bytes: u64 = args
        .get(2)
        .and_then(|s| s.parse().ok())
        .unwrap_or(2_000_000);
    let line = 100_000;
    for (name, cc, hint) in [
        ("metaroce+hint", Algorithm::MetaRoce, true),
        ("hint, no drain", Algorithm::MetaRoce, true),
        ("metaroce", Algorithm::MetaRoce, false),
        ("ecn-aimd", Algorithm::EcnAimd, false),
        ("dcqcn", Algorithm::Dcqcn(DcqcnParams::vendor(line)), false),
        (
            "dcqcn-paper",
            Algorithm::Dcqcn(DcqcnParams::paper(line)),
            false,
        ),
        (
            "timely",
            Algorithm::Timely(TimelyParams::paper(line)),
            false,
        ),
        ("swift", Algorithm::Swift(SwiftParams::htsim(64)), false),
    ] {
        let cfg = IncastConfig {
            senders: n,
            bytes,
            cc,
            hint,
            drain: name != "hint, no drain",
            ..IncastConfig::default()
        };
        let t = std::time::Instant::now();
        let r = run(&cfg);
        println!(
            "{name:14} ok {} jain {:.4} util {:.3} maxq {} KB drops {} marks {} cnps {} settle {:?} (window {}) rtt {} ns time {:.1} us retx {} [{:.1}s wall]",
            r.ok, r.jain_index, r.link_utilisation, r.max_queue_bytes / 1000, r.drops, r.marks, r.cnps,
            r.settle_rtts, r.settle_window_rtts, r.base_rtt_ns, r.virtual_time_us, r.retransmissions,
            t.elapsed().as_secs_f64()
        );
    }
}
