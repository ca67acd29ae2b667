//! The refusals a responder holds until the requester confirms them: a bounded table that keeps
//! its own count, so "does it hold any" is one comparison and can never disagree with the slots.

use super::*;

/// A fatal refusal the requester has not confirmed yet: its NACK goes again every
/// `refusal_resend`, and every ACK says refusals are outstanding.
#[derive(Debug, Clone, Copy)]
pub(super) struct Refusal {
    pub(super) pending: PendingNack,
    /// When its NACK goes again; `None` until it is first sent (it goes at once).
    pub(super) due: Option<Instant>,
}

/// At most `N` refusals.
#[derive(Debug, Clone)]
pub(super) struct RefusalTable<const N: usize> {
    slots: [Option<Refusal>; N],
    /// The slots taken; always the number of `Some` in `slots`.
    held: u8,
}

impl<const N: usize> RefusalTable<N> {
    pub(super) fn new() -> Self {
        RefusalTable {
            slots: [None; N],
            held: 0,
        }
    }

    /// Whether any refusal waits for its confirmation.
    pub(super) fn any(&self) -> bool {
        self.held > 0
    }

    /// Holds `pending` until it is confirmed; `false` (nothing held) when every slot is taken.
    pub(super) fn hold(&mut self, pending: PendingNack) -> bool {
        match self.slots.iter_mut().find(|r| r.is_none()) {
            Some(slot) => {
                *slot = Some(Refusal { pending, due: None });
                self.held += 1;
                true
            }
            None => false,
        }
    }

    /// Releases the refusal of `psn` that `nack` names exactly (its reason aside: a confirmation
    /// carries its own); `false` when none does.
    pub(super) fn confirm(&mut self, psn: Psn, nack: &MrNackRepr) -> bool {
        let found = self.slots.iter_mut().find(|r| {
            r.is_some_and(|r| {
                r.pending.psn == psn
                    && r.pending.nack
                        == MrNackRepr {
                            reason: r.pending.nack.reason,
                            ..*nack
                        }
            })
        });
        match found {
            Some(slot) => {
                *slot = None;
                self.held -= 1;
                true
            }
            None => false,
        }
    }

    /// A refusal whose NACK is due at `now` (never sent, or its resend time passed).
    ///
    /// The walks over the slots stay out of line: inlined into a caller that reads other timers
    /// (`poll_timeout`), the compiler loaded every slot before looking at the count, five cache
    /// lines a call for a table that is almost always empty.
    #[inline]
    pub(super) fn due(&mut self, now: Instant) -> Option<&mut Refusal> {
        if self.held == 0 {
            return None;
        }
        self.first_due(now)
    }

    #[cold]
    #[inline(never)]
    fn first_due(&mut self, now: Instant) -> Option<&mut Refusal> {
        self.slots
            .iter_mut()
            .flatten()
            .find(|r| r.due.is_none_or(|d| now >= d))
    }

    /// When the next NACK is due (0: at once), if any refusal is held.
    #[inline]
    pub(super) fn next_due(&self) -> Option<Instant> {
        if self.held == 0 {
            return None;
        }
        self.earliest_due()
    }

    #[cold]
    #[inline(never)]
    fn earliest_due(&self) -> Option<Instant> {
        self.slots
            .iter()
            .flatten()
            .map(|r| r.due.unwrap_or(Instant::ZERO))
            .min()
    }
}
