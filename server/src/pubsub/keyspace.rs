//! Keyspace notifications: Redis' `notify-keyspace-events`, plus strata's
//! tier moves.
//!
//! Every event goes out on `__keyspace@0__:<key>` (message: the event
//! name) when `K` is set, and on `__keyevent@0__:<event>` (message: the
//! key) when `E` is set, if its class is enabled:
//!
//! | flag | events |
//! | --- | --- |
//! | `g` | `del`, `expire` |
//! | `$` | `set` (`SET`, `MSET`, `PUT`, `MPUT`) |
//! | `x` | `expired` |
//! | `e` | `evicted` (the value left this node: no copy kept) |
//! | `m` | `keymiss` |
//! | `T` | `spilled` (DRAM → NVMe), `promoted` (NVMe → DRAM), `demoted` (GPU → DRAM) |
//!
//! `A` is Redis' alias for `g$lshzxetd`; it does not include `T`, so a
//! Redis tool sees what Redis would send. `l s h z t d` are accepted and
//! have no events here (strata holds strings only). `n` (new-key events) is
//! refused: strata does not track it.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::Hub;

/// Parsed flags, as bits.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Flags(u32);

const KEYSPACE: u32 = 1 << 0;
const KEYEVENT: u32 = 1 << 1;
const GENERIC: u32 = 1 << 2;
const STRING: u32 = 1 << 3;
const EXPIRED: u32 = 1 << 4;
const EVICTED: u32 = 1 << 5;
const KEYMISS: u32 = 1 << 6;
const TIER: u32 = 1 << 7;
// Types strata does not have; kept so CONFIG GET shows what was set.
const LIST: u32 = 1 << 8;
const SET: u32 = 1 << 9;
const HASH: u32 = 1 << 10;
const ZSET: u32 = 1 << 11;
const STREAM: u32 = 1 << 12;
const MODULE: u32 = 1 << 13;

/// Redis' `A`.
const ALL: u32 = GENERIC | STRING | LIST | SET | HASH | ZSET | EXPIRED | EVICTED | STREAM | MODULE;

/// In Redis' order for printing.
const CLASS_CHARS: [(char, u32); 10] = [
    ('g', GENERIC),
    ('$', STRING),
    ('l', LIST),
    ('s', SET),
    ('h', HASH),
    ('z', ZSET),
    ('x', EXPIRED),
    ('e', EVICTED),
    ('t', STREAM),
    ('d', MODULE),
];

impl Flags {
    /// Parses Redis' flag string (`KEA`, `Egx`, ``); an unknown flag is an
    /// error naming it.
    pub fn parse(s: &str) -> Result<Flags, String> {
        let mut bits = 0;
        for c in s.chars() {
            bits |= match c {
                'A' => ALL,
                'K' => KEYSPACE,
                'E' => KEYEVENT,
                'm' => KEYMISS,
                'T' => TIER,
                'n' => {
                    return Err(
                        "flag 'n' (new-key events) is not supported by strata".into()
                    )
                }
                _ => match CLASS_CHARS.iter().find(|(ch, _)| *ch == c) {
                    Some((_, bit)) => *bit,
                    None => {
                        return Err(format!(
                            "{c:?} is not a keyspace event flag (allowed: K E g $ x e m T A, and l s h z t d)"
                        ))
                    }
                },
            };
        }
        Ok(Flags(bits))
    }

    /// Whether an event of `class` goes out at all.
    fn publishes(self, class: Class) -> bool {
        self.0 & (KEYSPACE | KEYEVENT) != 0 && self.0 & class.bit() != 0
    }
}

impl fmt::Display for Flags {
    /// Redis' canonical form: `A` or the class flags, then `T`, `K`, `E`,
    /// `m`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        if b & ALL == ALL {
            f.write_str("A")?;
        } else {
            for (c, bit) in CLASS_CHARS {
                if b & bit != 0 {
                    write!(f, "{c}")?;
                }
            }
        }
        for (c, bit) in [
            ('T', TIER),
            ('K', KEYSPACE),
            ('E', KEYEVENT),
            ('m', KEYMISS),
        ] {
            if b & bit != 0 {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// An event strata publishes; its class decides which flag enables it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    Set,
    Del,
    Expire,
    Expired,
    Evicted,
    KeyMiss,
    Spilled,
    Promoted,
    Demoted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Generic,
    String,
    Expired,
    Evicted,
    KeyMiss,
    Tier,
}

impl Class {
    fn bit(self) -> u32 {
        match self {
            Class::Generic => GENERIC,
            Class::String => STRING,
            Class::Expired => EXPIRED,
            Class::Evicted => EVICTED,
            Class::KeyMiss => KEYMISS,
            Class::Tier => TIER,
        }
    }
}

impl Event {
    pub const ALL: [Event; 9] = [
        Event::Set,
        Event::Del,
        Event::Expire,
        Event::Expired,
        Event::Evicted,
        Event::KeyMiss,
        Event::Spilled,
        Event::Promoted,
        Event::Demoted,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Event::Set => "set",
            Event::Del => "del",
            Event::Expire => "expire",
            Event::Expired => "expired",
            Event::Evicted => "evicted",
            Event::KeyMiss => "keymiss",
            Event::Spilled => "spilled",
            Event::Promoted => "promoted",
            Event::Demoted => "demoted",
        }
    }

    fn class(self) -> Class {
        match self {
            Event::Set => Class::String,
            Event::Del | Event::Expire => Class::Generic,
            Event::Expired => Class::Expired,
            Event::Evicted => Class::Evicted,
            Event::KeyMiss => Class::KeyMiss,
            Event::Spilled | Event::Promoted | Event::Demoted => Class::Tier,
        }
    }

    fn index(self) -> usize {
        Event::ALL.iter().position(|&e| e == self).unwrap_or(0)
    }

    pub fn from_tier(e: strata_tiering::TierEvent) -> Event {
        use strata_tiering::TierEvent as T;
        match e {
            T::Evicted => Event::Evicted,
            T::Spilled => Event::Spilled,
            T::Expired => Event::Expired,
            T::Demoted => Event::Demoted,
            T::Promoted => Event::Promoted,
        }
    }
}

/// Events waiting to be sent, at most: a burst of evictions beyond this
/// (a subscriber-side backlog, not a writer's) is dropped and counted.
pub const MAX_QUEUED_EVENTS: usize = 65_536;

/// The live flags (`CONFIG SET notify-keyspace-events` changes them), the
/// events waiting to go out, and what was published.
///
/// Events are queued, in the order they happen, and sent by one task
/// ([`Hub::deliver_queued`]): the store reports evictions with its index
/// lock held, and matching a message against every pattern subscription
/// must not happen there. One queue for every event keeps a key's events
/// in order (an eviction and the write that brings the key back).
#[derive(Debug)]
pub struct Keyspace {
    flags: AtomicU32,
    /// Events published, per [`Event::ALL`] (whether or not anyone was
    /// subscribed).
    pub published: [AtomicU64; 9],
    pub queue: Arc<EventQueue>,
}

/// See [`Keyspace`].
#[derive(Debug, Default)]
pub struct EventQueue {
    events: Mutex<VecDeque<(Event, Bytes, Flags)>>,
    pub ready: Notify,
    /// Events dropped because the queue was full.
    pub dropped: AtomicU64,
}

impl Keyspace {
    pub fn new(flags: Flags) -> Keyspace {
        Keyspace {
            flags: AtomicU32::new(flags.0),
            published: Default::default(),
            queue: Arc::default(),
        }
    }

    pub fn flags(&self) -> Flags {
        Flags(self.flags.load(Relaxed))
    }

    pub fn set_flags(&self, flags: Flags) {
        self.flags.store(flags.0, Relaxed);
    }

    /// Whether `event` would be published now (callers may skip work).
    pub fn wants(&self, event: Event) -> bool {
        self.flags().publishes(event.class())
    }
}

const KEYSPACE_PREFIX: &[u8] = b"__keyspace@0__:";
const KEYEVENT_PREFIX: &[u8] = b"__keyevent@0__:";

impl Hub {
    /// Queues `event` on `key` for publishing, as the flags say. Quick and
    /// never blocking: callable with the store's locks held.
    pub fn notify(&self, event: Event, key: &[u8]) {
        let flags = self.keyspace.flags();
        if !flags.publishes(event.class()) {
            return;
        }
        self.keyspace.published[event.index()].fetch_add(1, Relaxed);
        if !self.is_listened() {
            return;
        }
        let q = &self.keyspace.queue;
        let mut events = q.events.lock();
        if events.len() >= MAX_QUEUED_EVENTS {
            q.dropped.fetch_add(1, Relaxed);
            return;
        }
        events.push_back((event, Bytes::copy_from_slice(key), flags));
        let first = events.len() == 1;
        drop(events);
        if first {
            q.ready.notify_one();
        }
    }

    /// Sends every queued event (the node's publisher task calls this when
    /// woken).
    pub fn deliver_queued(&self) {
        loop {
            let batch: Vec<_> = {
                let mut events = self.keyspace.queue.events.lock();
                let n = events.len().min(1024);
                events.drain(..n).collect()
            };
            if batch.is_empty() {
                return;
            }
            for (event, key, flags) in batch {
                self.send_event(event, &key, flags);
            }
        }
    }

    fn send_event(&self, event: Event, key: &[u8], flags: Flags) {
        let name = event.name().as_bytes();
        if flags.0 & KEYSPACE != 0 {
            let mut channel = Vec::with_capacity(KEYSPACE_PREFIX.len() + key.len());
            channel.extend_from_slice(KEYSPACE_PREFIX);
            channel.extend_from_slice(key);
            self.publish(&channel, name);
        }
        if flags.0 & KEYEVENT != 0 {
            let mut channel = Vec::with_capacity(KEYEVENT_PREFIX.len() + name.len());
            channel.extend_from_slice(KEYEVENT_PREFIX);
            channel.extend_from_slice(name);
            self.publish(&channel, key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_print_like_redis() {
        assert_eq!(Flags::parse("KEA").unwrap().to_string(), "AKE");
        assert_eq!(Flags::parse("").unwrap().to_string(), "");
        assert_eq!(Flags::parse("Ex$g").unwrap().to_string(), "g$xE");
        assert_eq!(Flags::parse("KT").unwrap().to_string(), "TK");
        assert!(Flags::parse("Kn").unwrap_err().contains("'n'"));
        assert!(Flags::parse("K?").unwrap_err().contains("'?'"));
        // Without K or E nothing goes out, whatever the classes.
        assert!(!Flags::parse("A").unwrap().publishes(Class::String));
        assert!(Flags::parse("E$").unwrap().publishes(Class::String));
        assert!(!Flags::parse("EA").unwrap().publishes(Class::Tier));
    }
}
