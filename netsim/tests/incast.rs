//! The incast bottleneck (`netsim::incast`): every byte arrives once and equal whatever the
//! controller; what each controller achieves is recorded in docs/BENCHMARKS.md.

use netsim::incast::{run, IncastConfig};
use transport_core::rate::{Algorithm, DcqcnParams};

#[test]
fn sixteen_metaroce_senders_with_the_hint_share_the_port_evenly_without_a_drop() {
    let r = run(&IncastConfig::default());
    assert!(r.ok, "{r:?}");
    assert_eq!(r.senders, 16);
    assert_eq!(r.drops, 0);
    assert!(r.jain_index >= 0.99, "{r:?}");
    // The queue the start builds drains: nothing close to the 32 MB buffer.
    assert!(r.max_queue_bytes < 4_000_000, "{r:?}");
    assert!(r.marks > 0);
}

#[test]
fn dcqcn_senders_get_cnps_and_every_byte_arrives() {
    let r = run(&IncastConfig {
        senders: 8,
        cc: Algorithm::Dcqcn(DcqcnParams::vendor(100_000)),
        hint: false,
        ..IncastConfig::default()
    });
    assert!(r.ok, "{r:?}");
    assert!(r.cnps > 0 && r.marks >= r.cnps, "{r:?}");
    assert!(r.jain_index >= 0.95, "{r:?}");
}

#[test]
fn a_small_buffer_drops_and_the_transport_repairs_every_loss() {
    let r = run(&IncastConfig {
        senders: 16,
        buffer_bytes: 200_000,
        kmin_bytes: 50_000,
        kmax_bytes: 150_000,
        ..IncastConfig::default()
    });
    assert!(r.ok, "{r:?}");
    assert!(r.drops > 0, "{r:?}");
    assert!(r.retransmissions >= r.drops, "{r:?}");
}
