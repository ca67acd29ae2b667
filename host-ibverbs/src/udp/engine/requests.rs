//! The requests of a queue pair waiting for their completions.

use super::*;

/// Something that keeps a posted buffer's memory alive until its completion.
pub(crate) type Keepalive = Rc<dyn std::any::Any>;

pub(crate) struct Pending {
    pub user_id: u64,
    pub keep: Keepalive,
}

/// The requests of a queue pair waiting for their completions, by the internal id the connection
/// knows them by: a slot index (low 32 bits) and the slot's generation (high 32), so that posting
/// and completing are an index each instead of a hash map insert and remove. Slots are reused;
/// there are never more than requests in flight at once.
#[derive(Default)]
pub(crate) struct Requests {
    slots: Vec<(u32, Option<Pending>)>,
    /// The empty slots.
    free: Vec<u32>,
}

impl Requests {
    /// The id the next `insert` gives.
    pub fn next_id(&self) -> u64 {
        match self.free.last() {
            Some(&i) => u64::from(self.slots[i as usize].0) << 32 | u64::from(i),
            None => self.slots.len() as u64,
        }
    }

    /// Remembers `p` under `next_id()`.
    pub fn insert(&mut self, p: Pending) {
        match self.free.pop() {
            Some(i) => self.slots[i as usize].1 = Some(p),
            None => self.slots.push((0, Some(p))),
        }
    }

    /// The request of `id`, if it is waiting.
    pub fn remove(&mut self, id: u64) -> Option<Pending> {
        let i = (id & 0xffff_ffff) as u32;
        let slot = self.slots.get_mut(i as usize)?;
        if u64::from(slot.0) != id >> 32 {
            return None;
        }
        let p = slot.1.take()?;
        slot.0 = slot.0.wrapping_add(1);
        self.free.push(i);
        Some(p)
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    /// Every waiting request's keepalive (the queue pair is going).
    pub fn into_keepalives(self) -> impl Iterator<Item = Keepalive> {
        self.slots
            .into_iter()
            .filter_map(|(_, p)| p.map(|p| p.keep))
    }
}

#[cfg(test)]
mod requests_tests {
    use super::*;

    fn pending(user_id: u64) -> Pending {
        Pending {
            user_id,
            keep: Rc::new(user_id),
        }
    }

    #[test]
    fn requests_reuse_slots_and_refuse_stale_ids() {
        let mut r = Requests::default();
        let mut ids = Vec::new();
        for u in 0..4 {
            let id = r.next_id();
            r.insert(pending(u));
            ids.push(id);
        }
        assert_eq!(ids, [0, 1, 2, 3], "fresh slots, generation 0");
        assert_eq!(r.len(), 4);
        assert_eq!(r.remove(ids[1]).map(|p| p.user_id), Some(1));
        assert!(r.remove(ids[1]).is_none(), "completed once only");
        // The slot comes back under its next generation; the old id does not reach it.
        let again = r.next_id();
        assert_eq!(again, 1 << 32 | 1);
        r.insert(pending(9));
        assert!(r.remove(ids[1]).is_none(), "a stale id");
        assert!(
            r.remove(7).is_none() && r.remove(u64::MAX).is_none(),
            "never given"
        );
        assert_eq!(r.remove(again).map(|p| p.user_id), Some(9));
        assert_eq!(r.len(), 3);
        let kept: Vec<u64> = r
            .into_keepalives()
            .map(|k| *k.downcast::<u64>().unwrap())
            .collect();
        assert_eq!(kept, [0, 2, 3]);
    }
}
