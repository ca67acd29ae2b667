//! Whether this thread has to wait for a CPU: the share of recent time it spent runnable but not
//! running, from the kernel's scheduler statistics (`/proc/thread-self/schedstat`, its second
//! field: nanoseconds spent waiting on a run queue).
//!
//! A polling loop uses it to choose how long to spin before it sleeps. On a host with CPUs to
//! spare, spinning for a while after the last work costs nobody anything and saves the wake-ups
//! (tens of microseconds on a virtual machine). On a host whose CPUs other tasks want too, every
//! microsecond spun is taken from them, from the kernel that carries this end's packets and from
//! a peer on the same host: there a loop should sleep as soon as it has nothing to do. A spinning
//! thread on such a host is preempted again and again (on the machines measured, 35-41% of its
//! time waiting on a run queue beside two busy loops, against 1-2% idle), and a thread that
//! sleeps at once still waits for a CPU after each wake-up there (35-37%), so the signal holds
//! whichever way the loop waits.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

/// Above this share of the time (percent) waiting on a run queue the CPU is contended.
pub const CONTENDED_ABOVE_PERCENT: u128 = 20;
/// Below this share (percent) a contended CPU is free again (between the two, the verdict
/// stands).
pub const FREE_BELOW_PERCENT: u128 = 10;
/// How often the statistics are read at most.
pub const INTERVAL: Duration = Duration::from_millis(10);

/// The run-queue delay in a `schedstat` line (`cpu_ns delay_ns timeslices`), if it is one.
pub fn parse_schedstat(text: &str) -> Option<u64> {
    let mut fields = text.split_ascii_whitespace();
    let _cpu: u64 = fields.next()?.parse().ok()?;
    let delay: u64 = fields.next()?.parse().ok()?;
    let _slices: u64 = fields.next()?.parse().ok()?;
    Some(delay)
}

/// The verdict after an interval of `wall` in which the thread waited `delay` for a CPU, given
/// the verdict before it (hysteresis between [`FREE_BELOW_PERCENT`] and
/// [`CONTENDED_ABOVE_PERCENT`]).
///
/// The share is of the wall time, sleeps included, not of the time the thread wanted a CPU
/// (its CPU time and the delay): on an idle virtual machine each wake-up of a thread that sleeps
/// often waits tens of microseconds for its CPU to wake, which against the little CPU time such
/// a thread uses would read as contention, and would keep it sleeping.
pub fn verdict(before: bool, delay: Duration, wall: Duration) -> bool {
    if wall.is_zero() {
        return before;
    }
    let (delay, wall) = (delay.as_nanos() * 100, wall.as_nanos());
    if delay > CONTENDED_ABOVE_PERCENT * wall {
        true
    } else if delay < FREE_BELOW_PERCENT * wall {
        false
    } else {
        before
    }
}

/// The calling thread's run-queue delay, read at most every [`INTERVAL`], and only when asked
/// (a loop asks when it finds nothing to do). Where the kernel offers no statistics (no procfs,
/// no `CONFIG_SCHED_INFO`), or a reading ever fails, the CPU counts as free from then on (the
/// file is not tried again): the loop then spins as it always did.
#[derive(Debug)]
pub struct CpuWait {
    /// The statistics of the thread that opened it.
    file: Option<File>,
    thread: std::thread::ThreadId,
    /// The last reading: when, and the delay then.
    at: Instant,
    delay_ns: u64,
    contended: bool,
    /// The file could not be opened or read: not tried again.
    unavailable: bool,
}

impl Default for CpuWait {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuWait {
    /// Starts with a free CPU; the first reading comes at the first [`CpuWait::contended`].
    pub fn new() -> Self {
        CpuWait {
            file: None,
            thread: std::thread::current().id(),
            at: Instant::now(),
            delay_ns: 0,
            contended: false,
            unavailable: false,
        }
    }

    /// Whether the calling thread has lately had to wait for a CPU. Reads the statistics when
    /// [`INTERVAL`] has passed since the last reading (`now` is the caller's clock), else
    /// repeats the last verdict. A call from another thread than the last starts over with that
    /// thread's statistics.
    pub fn contended(&mut self, now: Instant) -> bool {
        if self.unavailable || now.saturating_duration_since(self.at) < INTERVAL {
            return self.contended;
        }
        let me = std::thread::current().id();
        if self.file.is_none() || self.thread != me {
            // Another thread's verdict says nothing about this one.
            self.contended = false;
            self.thread = me;
            self.file = File::open("/proc/thread-self/schedstat").ok();
            match self.read() {
                Some(d) => (self.delay_ns, self.at) = (d, now),
                None => {
                    self.unavailable = true;
                    self.contended = false;
                }
            }
            return self.contended;
        }
        match self.read() {
            Some(d) => {
                let delay = Duration::from_nanos(d.saturating_sub(self.delay_ns));
                self.contended = verdict(self.contended, delay, now - self.at);
                (self.delay_ns, self.at) = (d, now);
            }
            None => {
                self.unavailable = true;
                self.contended = false;
            }
        }
        self.contended
    }

    /// Sets the verdict (tests of what a loop does with it).
    #[cfg(test)]
    pub(crate) fn force(&mut self, contended: bool) {
        self.contended = contended;
        self.unavailable = true;
    }

    fn read(&self) -> Option<u64> {
        let mut buf = [0u8; 96];
        let n = self.file.as_ref()?.read_at(&mut buf, 0).ok()?;
        parse_schedstat(std::str::from_utf8(&buf[..n]).ok()?)
    }
}

/// The calling thread's context switches: (voluntary, involuntary). Voluntary: times it gave the
/// CPU up of its own accord (it blocked: a sleep, a wait); involuntary: times the scheduler took
/// it away. For the tests of what a loop does when it waits.
#[cfg(test)]
pub(crate) fn context_switches() -> (i64, i64) {
    // SAFETY: all-zero bytes are a valid `rusage` (integers and timevals).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a valid, writable rusage for the call.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) };
    assert_eq!(rc, 0);
    (ru.ru_nvcsw, ru.ru_nivcsw)
}

/// Times the calling thread gave the CPU up of its own accord (see [`context_switches`]).
#[cfg(test)]
pub(crate) fn voluntary_switches() -> i64 {
    context_switches().0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schedstat_line_gives_its_delay_and_nothing_else_does() {
        assert_eq!(parse_schedstat("236847 75101 3\n"), Some(75101));
        assert_eq!(parse_schedstat("1 2 3"), Some(2));
        for bad in ["", "1 2", "1 x 3", "-1 2 3", "1 2 3.5", "a b c"] {
            assert_eq!(parse_schedstat(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_verdict_turns_above_a_fifth_and_back_below_a_tenth() {
        assert_eq!((CONTENDED_ABOVE_PERCENT, FREE_BELOW_PERCENT), (20, 10));
        let us = Duration::from_micros;
        let wall = Duration::from_millis(10);
        assert!(!verdict(false, us(0), wall));
        assert!(!verdict(false, us(2_000), wall), "20% is not above 20%");
        assert!(verdict(false, us(2_001), wall));
        assert!(verdict(false, us(4_000), wall));
        // Between the two thresholds the verdict stands, either way.
        for d in [us(1_000), us(1_500), us(2_000)] {
            assert!(verdict(true, d, wall), "{d:?}");
            assert!(!verdict(false, d, wall), "{d:?}");
        }
        assert!(!verdict(true, us(999), wall));
        assert!(
            verdict(true, us(3_000), Duration::ZERO),
            "no time passed: as before"
        );
    }

    /// Three threads that never sleep, all bound to this thread's CPU: this thread waits for
    /// it most of the time, and says so.
    #[test]
    fn a_thread_that_shares_its_cpu_with_busy_ones_is_contended() {
        // SAFETY: sched_getcpu has no arguments and no preconditions.
        let cpu = unsafe { libc::sched_getcpu() };
        assert!(cpu >= 0);
        let pin = |cpu: i32| {
            // SAFETY: an all-zero cpu_set_t is an empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            // SAFETY: CPU_SET writes the bit of `cpu`, a CPU number the kernel gave, in `set`.
            unsafe { libc::CPU_SET(cpu as usize, &mut set) };
            // SAFETY: `set` is a valid cpu_set_t of the size passed; 0 is the calling thread.
            unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) == 0 }
        };
        if !pin(cpu) {
            eprintln!("cannot bind threads to a CPU here: nothing to measure");
            return;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let busy: Vec<_> = (0..3)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    assert!(pin(cpu));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let mut w = CpuWait::new();
        let start = Instant::now();
        let mut verdicts = Vec::new();
        while start.elapsed() < Duration::from_millis(300) {
            verdicts.push(w.contended(Instant::now()));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for t in busy {
            t.join().unwrap();
        }
        assert!(
            !w.unavailable,
            "no scheduler statistics (/proc/thread-self/schedstat) on this kernel: adaptive \
             waiting cannot tell a contended CPU here"
        );
        assert!(
            verdicts.last() == Some(&true),
            "sharing one CPU with three busy threads: {} of {} verdicts contended",
            verdicts.iter().filter(|&&v| v).count(),
            verdicts.len()
        );
    }
}
