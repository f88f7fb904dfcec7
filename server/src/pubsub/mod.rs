//! Pub/sub, the way Redis does it: channels and glob patterns, messages
//! pushed to subscribed connections, and keyspace notifications
//! ([`keyspace`]) published on `__keyspace@0__:` / `__keyevent@0__:`.
//!
//! Publishing never waits for a subscriber. Each subscribed connection has
//! a [`Mailbox`]: a publisher encodes the message once per protocol
//! version and appends it there; the connection writes it out. A mailbox
//! holding more than `pubsub_output_buffer_limit` bytes (queued plus being
//! written) is cut: the message is dropped and counted, the connection is
//! closed, as Redis does at `client-output-buffer-limit pubsub`. So a
//! subscriber that stops reading costs at most that much memory, and
//! writers never slow down for it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use parking_lot::{Mutex, RwLock};
use strata_proto::{glob, RespVersion};
use tokio::sync::Notify;

pub mod keyspace;

/// The messages waiting for one subscribed connection.
#[derive(Debug)]
pub struct Mailbox {
    resp3: AtomicBool,
    queue: Mutex<Queue>,
    /// Woken when a message arrives or the mailbox is cut.
    ready: Notify,
    /// Woken when the mailbox is cut (a write stuck on a stalled socket
    /// waits on this).
    cut: Notify,
    limit: usize,
}

#[derive(Debug, Default)]
struct Queue {
    frames: VecDeque<Bytes>,
    /// Queued bytes plus those taken and not yet written.
    bytes: usize,
    cut: bool,
}

impl Mailbox {
    pub fn new(resp: RespVersion, limit: usize) -> Mailbox {
        Mailbox {
            resp3: AtomicBool::new(resp == RespVersion::Resp3),
            queue: Mutex::new(Queue::default()),
            ready: Notify::new(),
            cut: Notify::new(),
            limit,
        }
    }

    /// `HELLO` may switch protocols while subscribed.
    pub fn set_resp(&self, resp: RespVersion) {
        self.resp3.store(resp == RespVersion::Resp3, Relaxed);
    }

    fn resp3(&self) -> bool {
        self.resp3.load(Relaxed)
    }

    /// Appends a frame; `Err(first)` if the mailbox is cut (over its limit
    /// now, `first` = it was cut by this push).
    fn push(&self, frame: Bytes) -> Result<(), bool> {
        let mut q = self.queue.lock();
        if q.cut {
            return Err(false);
        }
        if q.bytes + frame.len() > self.limit {
            q.cut = true;
            q.frames.clear();
            drop(q);
            self.ready.notify_one();
            self.cut.notify_one();
            return Err(true);
        }
        q.bytes += frame.len();
        q.frames.push_back(frame);
        let first = q.frames.len() == 1;
        drop(q);
        if first {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Moves the queued frames into `out`; returns their size, which stays
    /// counted against the limit until [`Mailbox::written`].
    pub fn take(&self, out: &mut BytesMut) -> usize {
        let mut q = self.queue.lock();
        let mut n = 0;
        for f in q.frames.drain(..) {
            n += f.len();
            out.extend_from_slice(&f);
        }
        n
    }

    pub fn written(&self, n: usize) {
        let mut q = self.queue.lock();
        q.bytes = q.bytes.saturating_sub(n);
    }

    pub fn is_cut(&self) -> bool {
        self.queue.lock().cut
    }

    /// Returns once something is queued or the mailbox is cut.
    pub async fn ready(&self) {
        loop {
            {
                let q = self.queue.lock();
                if q.cut || !q.frames.is_empty() {
                    return;
                }
            }
            self.ready.notified().await;
        }
    }

    /// Returns once the mailbox is cut.
    pub async fn cut(&self) {
        while !self.is_cut() {
            self.cut.notified().await;
        }
    }
}

/// Subscriptions one connection may hold (channels plus patterns): the
/// hub's memory stays bounded by `max_connections` times this.
pub const MAX_SUBSCRIPTIONS: usize = 100_000;

/// What a connection is subscribed to.
#[derive(Debug)]
pub struct Subscriber {
    pub mailbox: Arc<Mailbox>,
    pub channels: HashSet<Bytes>,
    pub patterns: HashSet<Bytes>,
}

impl Subscriber {
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }
}

#[derive(Debug, Default)]
struct Subscriptions {
    channels: HashMap<Bytes, Vec<Arc<Mailbox>>>,
    patterns: HashMap<Bytes, Vec<Arc<Mailbox>>>,
}

/// Figures for INFO and `/metrics`.
#[derive(Debug, Default)]
pub struct Stats {
    /// Messages queued for subscribers (one per receiving connection).
    pub messages: AtomicU64,
    /// Messages dropped because their subscriber was over its limit.
    pub dropped: AtomicU64,
    /// Subscribers cut off at the limit.
    pub disconnected: AtomicU64,
}

/// Every subscription of a node.
#[derive(Debug)]
pub struct Hub {
    subs: RwLock<Subscriptions>,
    /// Channel plus pattern subscriptions, over all connections: lets a
    /// publisher with nobody listening return at once.
    listeners: AtomicUsize,
    /// Connections with at least one subscription.
    subscribers: AtomicUsize,
    pub limit: usize,
    pub stats: Stats,
    pub keyspace: keyspace::Keyspace,
}

/// Which kind of subscription.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Channel,
    Pattern,
}

impl Hub {
    pub fn new(limit: u64, flags: keyspace::Flags) -> Hub {
        Hub {
            subs: RwLock::new(Subscriptions::default()),
            listeners: AtomicUsize::new(0),
            subscribers: AtomicUsize::new(0),
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            stats: Stats::default(),
            keyspace: keyspace::Keyspace::new(flags),
        }
    }

    pub fn is_listened(&self) -> bool {
        self.listeners.load(Relaxed) > 0
    }

    /// Subscribes `sub` to `name`; returns false if it already was.
    pub fn subscribe(&self, sub: &mut Subscriber, kind: Kind, name: Bytes) -> bool {
        let was_idle = sub.count() == 0;
        let mine = match kind {
            Kind::Channel => &mut sub.channels,
            Kind::Pattern => &mut sub.patterns,
        };
        if !mine.insert(name.clone()) {
            return false;
        }
        if was_idle {
            self.subscribers.fetch_add(1, Relaxed);
        }
        let mut s = self.subs.write();
        let table = match kind {
            Kind::Channel => &mut s.channels,
            Kind::Pattern => &mut s.patterns,
        };
        table.entry(name).or_default().push(sub.mailbox.clone());
        self.listeners.fetch_add(1, Relaxed);
        true
    }

    /// Unsubscribes `sub` from `name`; returns false if it was not.
    pub fn unsubscribe(&self, sub: &mut Subscriber, kind: Kind, name: &[u8]) -> bool {
        let mine = match kind {
            Kind::Channel => &mut sub.channels,
            Kind::Pattern => &mut sub.patterns,
        };
        if !mine.remove(name) {
            return false;
        }
        if sub.count() == 0 {
            self.subscribers.fetch_sub(1, Relaxed);
        }
        let mut s = self.subs.write();
        let table = match kind {
            Kind::Channel => &mut s.channels,
            Kind::Pattern => &mut s.patterns,
        };
        if let Some(list) = table.get_mut(name) {
            list.retain(|m| !Arc::ptr_eq(m, &sub.mailbox));
            if list.is_empty() {
                table.remove(name);
            }
        }
        self.listeners.fetch_sub(1, Relaxed);
        true
    }

    /// Drops every subscription of a closing connection.
    pub fn leave(&self, sub: &mut Subscriber) {
        while let Some(name) = sub.channels.iter().next().cloned() {
            self.unsubscribe(sub, Kind::Channel, &name);
        }
        while let Some(name) = sub.patterns.iter().next().cloned() {
            self.unsubscribe(sub, Kind::Pattern, &name);
        }
    }

    /// Sends `message` on `channel`; returns how many connections it was
    /// queued for (Redis' `PUBLISH` reply).
    pub fn publish(&self, channel: &[u8], message: &[u8]) -> usize {
        if !self.is_listened() {
            return 0;
        }
        let s = self.subs.read();
        let mut sent = 0;
        if let Some(list) = s.channels.get(channel) {
            let mut frames = Frames::default();
            for m in list {
                let f = frames.get(m.resp3(), |resp3| {
                    encode(resp3, &[b"message", channel, message])
                });
                sent += self.deliver(m, f);
            }
        }
        for (pattern, list) in &s.patterns {
            if !glob::matches(pattern, channel) {
                continue;
            }
            let mut frames = Frames::default();
            for m in list {
                let f = frames.get(m.resp3(), |resp3| {
                    encode(resp3, &[b"pmessage", pattern, channel, message])
                });
                sent += self.deliver(m, f);
            }
        }
        sent
    }

    fn deliver(&self, m: &Mailbox, frame: Bytes) -> usize {
        match m.push(frame) {
            Ok(()) => {
                self.stats.messages.fetch_add(1, Relaxed);
                1
            }
            Err(first) => {
                self.stats.dropped.fetch_add(1, Relaxed);
                if first {
                    self.stats.disconnected.fetch_add(1, Relaxed);
                }
                0
            }
        }
    }

    /// Channels with at least one subscriber matching `pattern` (`None`:
    /// all), for `PUBSUB CHANNELS`.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Bytes> {
        let s = self.subs.read();
        s.channels
            .keys()
            .filter(|c| pattern.is_none_or(|p| glob::matches(p, c)))
            .cloned()
            .collect()
    }

    /// Subscribers of `channel` (not counting patterns): `PUBSUB NUMSUB`.
    pub fn numsub(&self, channel: &[u8]) -> usize {
        self.subs.read().channels.get(channel).map_or(0, Vec::len)
    }

    /// Pattern subscriptions over all connections: `PUBSUB NUMPAT`.
    pub fn numpat(&self) -> usize {
        self.subs.read().patterns.values().map(Vec::len).sum()
    }

    pub fn subscribers(&self) -> usize {
        self.subscribers.load(Relaxed)
    }

    pub fn channel_count(&self) -> usize {
        self.subs.read().channels.len()
    }

    pub fn pattern_count(&self) -> usize {
        self.subs.read().patterns.len()
    }
}

/// The reply to (un)subscribing one name: `[verb, name or nil, the
/// connection's subscriptions now]`, a push in RESP3.
pub fn confirmation(verb: &str, name: Option<Bytes>, count: usize) -> strata_proto::Reply {
    use strata_proto::Reply;
    Reply::Push(vec![
        Reply::text(verb),
        name.map_or(Reply::Nil, Reply::Bulk),
        Reply::Int(count as i64),
    ])
}

/// One message encoded at most once per protocol version.
#[derive(Default)]
struct Frames {
    resp2: Option<Bytes>,
    resp3: Option<Bytes>,
}

impl Frames {
    fn get(&mut self, resp3: bool, make: impl FnOnce(bool) -> Bytes) -> Bytes {
        let slot = if resp3 {
            &mut self.resp3
        } else {
            &mut self.resp2
        };
        slot.get_or_insert_with(|| make(resp3)).clone()
    }
}

/// A push of bulk strings: `>n` in RESP3, an array in RESP2.
fn encode(resp3: bool, parts: &[&[u8]]) -> Bytes {
    let len: usize = parts.iter().map(|p| p.len() + 16).sum();
    let mut out = BytesMut::with_capacity(len + 8);
    out.extend_from_slice(if resp3 { b">" } else { b"*" });
    out.extend_from_slice(parts.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for p in parts {
        strata_proto::reply::bulk_header(p.len(), &mut out);
        out.extend_from_slice(p);
        out.extend_from_slice(b"\r\n");
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subscriber(hub: &Hub, resp: RespVersion) -> Subscriber {
        Subscriber {
            mailbox: Arc::new(Mailbox::new(resp, hub.limit)),
            channels: HashSet::new(),
            patterns: HashSet::new(),
        }
    }

    fn drain(sub: &Subscriber) -> Vec<u8> {
        let mut out = BytesMut::new();
        let n = sub.mailbox.take(&mut out);
        sub.mailbox.written(n);
        out.to_vec()
    }

    #[test]
    fn channels_and_patterns_get_their_frames() {
        let hub = Hub::new(1 << 20, keyspace::Flags::default());
        let mut a = subscriber(&hub, RespVersion::Resp2);
        let mut b = subscriber(&hub, RespVersion::Resp3);
        assert!(hub.subscribe(&mut a, Kind::Channel, Bytes::from_static(b"news")));
        assert!(!hub.subscribe(&mut a, Kind::Channel, Bytes::from_static(b"news")));
        assert!(hub.subscribe(&mut b, Kind::Pattern, Bytes::from_static(b"n*")));
        assert_eq!(hub.publish(b"news", b"hi"), 2);
        assert_eq!(hub.publish(b"other", b"x"), 0);
        assert_eq!(
            drain(&a),
            b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n".to_vec()
        );
        assert_eq!(
            drain(&b),
            b">4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$2\r\nhi\r\n".to_vec()
        );
        assert_eq!(hub.numsub(b"news"), 1);
        assert_eq!(hub.numpat(), 1);
        assert_eq!(hub.subscribers(), 2);
        hub.leave(&mut a);
        hub.leave(&mut b);
        assert!(!hub.is_listened());
        assert_eq!(hub.subscribers(), 0);
        assert!(hub.channels(None).is_empty());
    }

    #[test]
    fn a_subscriber_over_its_limit_is_cut_and_counted() {
        let hub = Hub::new(100, keyspace::Flags::default());
        let mut slow = subscriber(&hub, RespVersion::Resp2);
        let mut fast = subscriber(&hub, RespVersion::Resp2);
        hub.subscribe(&mut slow, Kind::Channel, Bytes::from_static(b"c"));
        hub.subscribe(&mut fast, Kind::Channel, Bytes::from_static(b"c"));
        let mut cut_at = None;
        for i in 0..10 {
            hub.publish(b"c", b"0123456789");
            drain(&fast);
            if cut_at.is_none() && slow.mailbox.is_cut() {
                cut_at = Some(i);
            }
        }
        // Each frame is 37 bytes: the third would pass 100.
        assert_eq!(cut_at, Some(2));
        assert!(!fast.mailbox.is_cut());
        assert_eq!(hub.stats.disconnected.load(Relaxed), 1);
        assert_eq!(hub.stats.dropped.load(Relaxed), 8);
        assert_eq!(hub.stats.messages.load(Relaxed), 12);
    }
}
