//! A bounded ring of `N` slots whose entries keep a sequence number from push to pop, so that
//! other records can name them (a packet names its message by it). The numbers wrap at 2^32,
//! which `N` never comes near.

/// Entries `head..tail` (wrapping) are live; every live slot holds its entry.
#[derive(Debug, Clone)]
pub(super) struct Ring<T, const N: usize> {
    slots: [Option<T>; N],
    head: u32,
    tail: u32,
}

impl<T: Copy, const N: usize> Ring<T, N> {
    pub(super) const fn new() -> Self {
        Ring {
            slots: [None; N],
            head: 0,
            tail: 0,
        }
    }

    /// Live entries.
    pub(super) fn len(&self) -> usize {
        self.tail.wrapping_sub(self.head) as usize
    }

    pub(super) fn is_empty(&self) -> bool {
        self.head == self.tail
    }

    pub(super) fn is_full(&self) -> bool {
        self.len() >= N
    }

    /// The number of the oldest entry (the next to pop), or of the next push when empty.
    pub(super) fn head(&self) -> u32 {
        self.head
    }

    /// The number the next push gets.
    pub(super) fn tail(&self) -> u32 {
        self.tail
    }

    /// Whether entry `seq` is live.
    pub(super) fn contains(&self, seq: u32) -> bool {
        (seq.wrapping_sub(self.head) as usize) < self.len()
    }

    /// Appends `v` and returns its number; gives it back when the ring is full.
    pub(super) fn push(&mut self, v: T) -> Result<u32, T> {
        if self.is_full() {
            return Err(v);
        }
        let seq = self.tail;
        self.slots[seq as usize % N] = Some(v);
        self.tail = seq.wrapping_add(1);
        Ok(seq)
    }

    /// Entry `seq`, if it is live.
    pub(super) fn get(&self, seq: u32) -> Option<&T> {
        if self.contains(seq) {
            self.slots[seq as usize % N].as_ref()
        } else {
            None
        }
    }

    /// Entry `seq`, if it is live.
    pub(super) fn get_mut(&mut self, seq: u32) -> Option<&mut T> {
        if self.contains(seq) {
            self.slots[seq as usize % N].as_mut()
        } else {
            None
        }
    }

    /// The oldest entry.
    pub(super) fn front(&self) -> Option<&T> {
        self.get(self.head)
    }

    /// Removes and returns the oldest entry.
    pub(super) fn pop(&mut self) -> Option<T> {
        if self.is_empty() {
            return None;
        }
        let v = self.slots[self.head as usize % N].take();
        self.head = self.head.wrapping_add(1);
        v
    }

    /// The numbers of the live entries, oldest first.
    pub(super) fn seqs(&self) -> impl Iterator<Item = u32> {
        let head = self.head;
        (0..self.len() as u32).map(move |i| head.wrapping_add(i))
    }
}

#[cfg(test)]
mod tests {
    use super::Ring;

    #[test]
    fn entries_keep_their_numbers_across_the_wrap_and_the_bound_holds() {
        let mut r: Ring<u8, 4> = Ring::new();
        r.head = u32::MAX - 1;
        r.tail = u32::MAX - 1;
        let a = r.push(1).unwrap();
        let b = r.push(2).unwrap();
        let c = r.push(3).unwrap();
        assert_eq!((a, b, c), (u32::MAX - 1, u32::MAX, 0));
        assert_eq!(r.get(c), Some(&3));
        r.push(4).unwrap();
        assert_eq!(r.push(5), Err(5), "full at N");
        assert_eq!(r.pop(), Some(1));
        assert_eq!(
            r.get(a),
            None,
            "a popped entry is gone, not its slot's next tenant"
        );
        let e = r.push(5).unwrap();
        assert_eq!(e as usize % 4, a as usize % 4);
        assert_eq!(r.get(a), None);
        assert_eq!(r.get(e), Some(&5));
        assert!(r.seqs().eq([b, c, c + 1, e]));
        *r.get_mut(b).unwrap() = 9;
        assert_eq!(r.front(), Some(&9));
        while r.pop().is_some() {}
        assert!(r.is_empty() && r.get(e).is_none());
    }
}
