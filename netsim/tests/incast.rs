//! The incast bottleneck (`netsim::incast`): every byte arrives once and equal whatever the
//! controller; what each controller achieves is recorded in docs/BENCHMARKS.md.

use netsim::incast::{run, IncastConfig};
use transport_core::rate::{Algorithm, DcqcnParams};

#[test]
fn sixteen_metaroce_senders_with_the_hint_settle_at_once_and_keep_the_port_busy() {
    // The targets for 16-to-1: Jain >= 0.99, utilisation >= 0.95, no drop, settled
    // within 2 RTTs of the start.
    let r = run(&IncastConfig::default());
    assert!(r.ok, "{r:?}");
    assert_eq!(r.senders, 16);
    assert_eq!(r.drops, 0);
    assert!(r.jain_index >= 0.99, "{r:?}");
    assert!(r.link_utilisation >= 0.95, "{r:?}");
    assert!(r.settle_rtts.is_some_and(|s| s <= 2), "{r:?}");
    assert_eq!(r.retransmissions, 0, "{r:?}");
    // The queue the start builds drains: nothing close to the 32 MB buffer.
    assert!(r.max_queue_bytes < 2_000_000, "{r:?}");
}

#[test]
fn sixty_four_metaroce_senders_with_the_hint_settle_at_once_and_keep_the_port_busy() {
    // The same targets for 64-to-1: a first round of 4 MB in the queue, paid for by every
    // sender at its share before it sends again.
    let r = run(&IncastConfig {
        senders: 64,
        ..IncastConfig::default()
    });
    assert!(r.ok, "{r:?}");
    assert_eq!(r.drops, 0);
    assert!(r.jain_index >= 0.99, "{r:?}");
    assert!(r.link_utilisation >= 0.95, "{r:?}");
    assert!(r.settle_rtts.is_some_and(|s| s <= 2), "{r:?}");
    assert_eq!(r.retransmissions, 0, "{r:?}");
}

#[test]
fn without_the_hint_metaroce_senders_do_not_settle() {
    // The same incast with ECN alone: fair over the whole run, but never within 10% of the
    // share window by window (the hint is what settles it).
    let r = run(&IncastConfig {
        hint: false,
        ..IncastConfig::default()
    });
    assert!(r.ok, "{r:?}");
    assert!(r.jain_index >= 0.99, "{r:?}");
    assert_eq!(r.settle_rtts, None, "{r:?}");
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
