//! The node's one clock: wall-clock milliseconds, because TTLs and value
//! versions are absolute times (as in Redis) that other nodes compare.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch; TTLs are absolute times,
/// as in Redis.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The clock of a run of requests that a connection executes back to
/// back (a pipelined batch): one reading of the monotonic clock per
/// request, which ends the request's time and starts the next one's, and
/// the wall clock read once per run and carried forward by the monotonic
/// one. Three readings per request (wall time, start, end) were a visible
/// share of a pipelined GET's CPU (docs/bench-notes/request-path.md). A
/// run that waited (I/O, a bring-in) is restarted, so nothing waited
/// counts toward the next request's time.
#[derive(Debug, Clone, Copy)]
pub struct RunClock {
    wall_ms: u64,
    base: Instant,
    mark: Instant,
}

impl RunClock {
    pub fn start() -> RunClock {
        let base = Instant::now();
        RunClock {
            wall_ms: now_ms(),
            base,
            mark: base,
        }
    }

    /// Wall-clock milliseconds at the start of the current request.
    pub fn now_ms(&self) -> u64 {
        self.wall_ms + self.mark.duration_since(self.base).as_millis() as u64
    }

    /// When the current request started.
    pub fn mark(&self) -> Instant {
        self.mark
    }

    /// Ends the current request: its time, and the next one starts now.
    pub fn tick(&mut self) -> Duration {
        let now = Instant::now();
        let took = now.duration_since(self.mark);
        self.mark = now;
        took
    }

    /// After a wait: start over from fresh readings of both clocks.
    pub fn restart(&mut self) {
        *self = RunClock::start();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_keeps_wall_time_and_times_each_request() {
        let mut c = RunClock::start();
        let first = c.now_ms();
        assert!(first.abs_diff(now_ms()) <= 1);
        std::thread::sleep(Duration::from_millis(20));
        let took = c.tick();
        assert!(took >= Duration::from_millis(20), "{took:?}");
        // The next request starts where the last one ended, and the wall
        // clock moved with it.
        assert!(c.now_ms() >= first + 20);
        assert!(c.now_ms().abs_diff(now_ms()) <= 1);
        assert!(c.tick() < Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(5));
        c.restart();
        assert!(c.tick() < Duration::from_millis(5));
    }
}
