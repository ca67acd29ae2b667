//! The end of a run: every byte compared with its source, every atomic counted.

use crate::config::SelftestReport;
use crate::endpoint::Endpoint;
use crate::workload::{Msg, COUNTERS};
use transport_core::conn::WrOp;

/// Fills `report.atomics_exact` and `report.bytes_verified` from the two ends' memories.
///
/// Each counter must end at the number of its fetch-and-adds, and the original values returned
/// for it must be exactly 0, 1, ..., n - 1. Each Write and Send must have landed in B's
/// destination equal to A's source, each Read in A's destination equal to B's source.
pub(crate) fn verify(plan: &[Msg], a: &Endpoint, b: &Endpoint, report: &mut SelftestReport) {
    let word =
        |m: &[u8], i: usize| u64::from_ne_bytes(m[8 * i..8 * i + 8].try_into().expect("8 bytes"));
    let mut per_counter: Vec<Vec<u64>> = vec![Vec::new(); COUNTERS];
    for (id, m) in plan.iter().enumerate() {
        if matches!(m.op, WrOp::FetchAdd(_)) {
            per_counter[id % COUNTERS].push(word(&a.atom, id));
        }
    }
    report.atomics_exact = per_counter.iter_mut().enumerate().all(|(c, origs)| {
        origs.sort_unstable();
        let count = word(&b.atom, c);
        count == origs.len() as u64 && origs.iter().enumerate().all(|(i, v)| *v == i as u64)
    });
    for m in plan.iter().filter(|m| !matches!(m.op, WrOp::FetchAdd(_))) {
        let r = m.offset as usize..(m.offset + u64::from(m.len)) as usize;
        let (got, want) = match m.op {
            WrOp::Read => (&a.dst[r.clone()], &b.src[r]),
            _ => (&b.dst[r.clone()], &a.src[r]),
        };
        report.bytes_verified += got.iter().zip(want).filter(|(x, y)| x == y).count() as u64;
    }
}
