//! What A asks of B: messages that cover the buffers in order, with their operations and
//! streams, posted while there is room; and the completions, checked for order.

use crate::config::{Ops, SelftestConfig, SelftestReport};
use crate::endpoint::{Endpoint, BASE_A, BASE_B};
use crate::{Q, S};
use metaroce_frames::gen::Rng;
use std::collections::HashMap;
use transport_core::conn::{
    Completion, CompletionKind, RecvRequest, RemoteAddr, Status, WorkRequest, WrOp,
};
use transport_core::time::Instant;

/// B's region over both of its buffers.
pub(crate) const KEY_B: u32 = 0xb0b;
/// B's region of counters.
pub(crate) const KEY_ATOM: u32 = 0xa70;
/// Counters B exposes to fetch-and-add.
pub(crate) const COUNTERS: usize = 8;

/// One message of the plan.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Msg {
    pub op: WrOp,
    pub stream: u16,
    /// Where it starts in the buffers (0 for an atomic).
    pub offset: u64,
    pub len: u32,
}

/// The messages: 16 KiB to 1 MiB each, covering `[0, cfg.bytes)` in order; with the mixed
/// workload every operation on several streams, and a fetch-and-add after a third of them.
pub(crate) fn plan(cfg: &SelftestConfig, rng: &mut Rng) -> Vec<Msg> {
    let mut plan = Vec::new();
    let mut off = 0u64;
    while off < cfg.bytes {
        let len = (16_384 + rng.below(1 << 20)).min(cfg.bytes - off) as u32;
        let (op, stream) = match cfg.ops {
            Ops::Write => (WrOp::Write, 0),
            Ops::Mixed => {
                let op = match rng.below(5) {
                    0 => WrOp::Write,
                    1 => WrOp::WriteWithImm(rng.next_u64() as u32),
                    2 => WrOp::Send,
                    3 => WrOp::SendWithImm(rng.next_u64() as u32),
                    _ => WrOp::Read,
                };
                (op, rng.below(S as u64) as u16)
            }
        };
        plan.push(Msg {
            op,
            stream,
            offset: off,
            len,
        });
        off += u64::from(len);
        if cfg.ops == Ops::Mixed && rng.below(3) == 0 {
            let stream = rng.below(S as u64) as u16;
            plan.push(Msg {
                op: WrOp::FetchAdd(1),
                stream,
                offset: 0,
                len: 8,
            });
        }
    }
    plan
}

/// The plan as it runs.
pub(crate) struct Workload {
    pub plan: Vec<Msg>,
    size: u64,
    next_post: usize,
    in_flight: usize,
    /// The next completion id expected per (side, stream).
    expected_next: HashMap<(bool, u16), u64>,
}

impl Workload {
    pub fn new(plan: Vec<Msg>, size: u64) -> Self {
        Workload {
            plan,
            size,
            next_post: 0,
            in_flight: 0,
            expected_next: HashMap::new(),
        }
    }

    /// Where B's counters start.
    pub fn atom_base(&self) -> u64 {
        BASE_B + 2 * self.size
    }

    /// Posts the next messages (and B's receives for those that consume one) while fewer than
    /// half the queue are in flight and both connections take them.
    pub fn post(&mut self, now: Instant, a: &mut Endpoint, b: &mut Endpoint) {
        let size = self.size;
        let res_base = BASE_A + 2 * size;
        while self.next_post < self.plan.len() && self.in_flight < Q / 2 {
            let m = self.plan[self.next_post];
            let id = self.next_post as u64;
            let remote = match m.op {
                WrOp::Read => RemoteAddr {
                    va: BASE_B + size + m.offset,
                    rkey: KEY_B,
                },
                WrOp::FetchAdd(_) => RemoteAddr {
                    va: self.atom_base() + 8 * (id % COUNTERS as u64),
                    rkey: KEY_ATOM,
                },
                _ => RemoteAddr {
                    va: BASE_B + m.offset,
                    rkey: KEY_B,
                },
            };
            let local_addr = match m.op {
                WrOp::Read => BASE_A + size + m.offset,
                WrOp::FetchAdd(_) => res_base + 8 * id,
                _ => BASE_A + m.offset,
            };
            if matches!(
                m.op,
                WrOp::Send | WrOp::SendWithImm(_) | WrOp::WriteWithImm(_)
            ) {
                let rr = RecvRequest {
                    id,
                    stream: m.stream,
                    addr: BASE_B + m.offset,
                    len: m.len,
                };
                if b.conn.post_recv(rr).is_err() {
                    break;
                }
            }
            let wr = WorkRequest {
                id,
                op: m.op,
                stream: m.stream,
                local_addr,
                len: m.len,
                remote,
            };
            if a.conn.post(now, wr).is_err() {
                break;
            }
            self.next_post += 1;
            self.in_flight += 1;
            a.wake(now);
        }
    }

    /// Checks a completion on side A (`is_a`) or B: in order within its stream and successful.
    /// Returns whether it completes one of A's requests.
    pub fn complete(&mut self, is_a: bool, c: &Completion, report: &mut SelftestReport) -> bool {
        let requester = matches!(
            c.kind,
            CompletionKind::Send
                | CompletionKind::Write
                | CompletionKind::Read
                | CompletionKind::Atomic
        );
        let exp = self.expected_next.entry((is_a, c.stream)).or_insert(0);
        // In order within a stream: ids of one stream on one side increase.
        if c.id < *exp || c.status != Status::Success {
            report.completion_errors += 1;
        }
        *exp = c.id + 1;
        if requester && is_a {
            report.completions += 1;
            self.in_flight -= 1;
            return true;
        }
        false
    }

    /// Whether every message has completed.
    pub fn done(&self, report: &SelftestReport) -> bool {
        report.completions as usize == self.plan.len()
    }
}
