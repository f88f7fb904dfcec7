//! The node's one clock: wall-clock milliseconds, because TTLs and value
//! versions are absolute times (as in Redis) that other nodes compare.

use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch; TTLs are absolute times,
/// as in Redis.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
