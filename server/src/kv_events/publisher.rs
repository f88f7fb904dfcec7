//! The publisher's sockets and task: a PUB socket that sends each batch
//! as vLLM's `ZmqEventPublisher` does — three frames, `[topic, seq as 8
//! bytes big-endian, msgpack KVEventBatch]`, seq counting batches from 0
//! — and an optional ROUTER that replays recent batches to a subscriber
//! that missed some: it sends `[ "", start_seq ]` (a DEALER, or REQ's
//! envelope) and gets every kept batch from `start_seq` on, then
//! `["", -1 as 8 bytes, ""]`.
//!
//! A PUB socket never blocks on its subscribers (one that falls behind
//! loses messages, as with libzmq's high-water mark); a subscriber that
//! sees a gap in seq asks the replay socket for it. In connect mode the
//! node reconnects by itself, and batches made while it is away are kept
//! for replay and numbered, so the router sees the gap.

use std::collections::VecDeque;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use futures::StreamExt;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use zeromq::{PubSocket, RouterSocket, Socket, SocketEvent, SocketRecv, SocketSend, ZmqMessage};

use super::endpoint::Target;
use super::wire::{self, Change, Coalescer, Event, Medium};
use super::Stats;

/// Changes folded into one batch at most: bounds a batch's size (about
/// 110 bytes per event) and how long the task runs between awaits.
pub const BATCH_CHANGES_MAX: usize = 1024;
/// Batches kept for replay at most (vLLM's `buffer_steps` default)...
pub const REPLAY_BATCHES_MAX: usize = 10_000;
/// ...and their bytes at most.
pub const REPLAY_BYTES_MAX: usize = 64 << 20;
/// vLLM's end-of-replay marker: -1 as a signed 8-byte big-endian integer.
const END_SEQ: [u8; 8] = [0xff; 8];
/// Between attempts to reach a router that is not up (connect mode).
const RECONNECT_DELAY: Duration = Duration::from_secs(1);
/// After a failed receive on the replay socket, before the next.
const REPLAY_ERROR_DELAY: Duration = Duration::from_millis(100);

/// What the publisher was configured with.
#[derive(Debug)]
pub struct Settings {
    pub endpoint: Target,
    /// The replay ROUTER's bind address, if any.
    pub replay: Option<String>,
    pub topic: String,
    pub media: Vec<Medium>,
    pub block_size: u32,
}

/// Binds the sockets, starts the tasks; returns the PUB endpoint (bound,
/// or connected to) and the replay endpoint as bound (empty when off).
pub async fn spawn(
    s: Settings,
    rx: mpsc::Receiver<Change>,
    stats: Arc<Stats>,
) -> anyhow::Result<(String, String)> {
    let topic = Bytes::from(s.topic.clone().into_bytes());
    let (sock, endpoint) = match &s.endpoint {
        Target::Bind(ep) => {
            let mut sock = PubSocket::new();
            let bound = sock
                .bind(ep)
                .await
                .with_context(|| format!("kv_events_endpoint: cannot bind {ep}"))?;
            (Pub::Ready(sock, None), bound.to_string())
        }
        Target::Connect(ep) => (Pub::Connecting(connect(ep.clone())), ep.clone()),
    };
    let (ring, replay_endpoint) = match &s.replay {
        None => (None, String::new()),
        Some(ep) => {
            let mut router = RouterSocket::new();
            let bound = router
                .bind(ep)
                .await
                .with_context(|| format!("kv_events_replay_endpoint: cannot bind {ep}"))?;
            let ring = Arc::new(Mutex::new(Ring::default()));
            tokio::spawn(serve_replay(
                router,
                ring.clone(),
                topic.clone(),
                stats.clone(),
            ));
            (Some(ring), bound.to_string())
        }
    };
    let task = Publisher {
        coalescer: Coalescer::new(s.media, s.block_size),
        topic,
        ring,
        stats,
        reconnect_to: match s.endpoint {
            Target::Connect(ep) => Some(ep),
            Target::Bind(_) => None,
        },
    };
    tokio::spawn(task.run(sock, rx));
    Ok((endpoint, replay_endpoint))
}

/// The PUB socket: ready (in connect mode with the monitor that tells of
/// the router going away), or being connected by its own task.
enum Pub {
    Ready(
        PubSocket,
        Option<futures::channel::mpsc::Receiver<SocketEvent>>,
    ),
    Connecting(JoinHandle<(PubSocket, futures::channel::mpsc::Receiver<SocketEvent>)>),
}

/// Connects a fresh PUB socket to `ep`, retrying until it answers.
fn connect(ep: String) -> JoinHandle<(PubSocket, futures::channel::mpsc::Receiver<SocketEvent>)> {
    tokio::spawn(async move {
        let mut sock = PubSocket::new();
        let monitor = sock.monitor();
        let mut told = false;
        loop {
            match sock.connect(&ep).await {
                Ok(()) => {
                    tracing::info!(endpoint = %ep, "KV events: connected to the router");
                    return (sock, monitor);
                }
                Err(e) => {
                    if !told {
                        tracing::warn!(endpoint = %ep, error = %e, "KV events: cannot reach kv_events_endpoint; retrying every second, batches kept for replay meanwhile");
                        told = true;
                    }
                    tokio::time::sleep(RECONNECT_DELAY).await;
                }
            }
        }
    })
}

struct Publisher {
    coalescer: Coalescer,
    topic: Bytes,
    ring: Option<Arc<Mutex<Ring>>>,
    stats: Arc<Stats>,
    /// Connect mode: where to reconnect when the router goes away.
    reconnect_to: Option<String>,
}

impl Publisher {
    /// Runs until every sender is gone (the node stopped).
    async fn run(mut self, mut sock: Pub, mut rx: mpsc::Receiver<Change>) {
        let mut changes = Vec::with_capacity(BATCH_CHANGES_MAX);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut changes, BATCH_CHANGES_MAX) => {
                    if n == 0 {
                        return;
                    }
                    for c in changes.drain(..) {
                        self.coalescer.push(c);
                    }
                    self.publish(&mut sock).await;
                }
                turn = turn(&mut sock) => match turn {
                    Turn::Connected(ready) => sock = ready,
                    Turn::RouterLeft => {
                        if let Some(ep) = &self.reconnect_to {
                            tracing::warn!(endpoint = %ep, "KV events: the router went away; reconnecting");
                            sock = Pub::Connecting(connect(ep.clone()));
                        }
                    }
                },
            }
        }
    }

    async fn publish(&mut self, sock: &mut Pub) {
        let events = self.coalescer.take();
        if events.is_empty() {
            return;
        }
        self.count(&events);
        let payload = Bytes::from(wire::encode_batch(now_s(), &events, 0));
        let seq = self.stats.batches.fetch_add(1, Relaxed);
        if let Pub::Ready(s, _) = sock {
            let frames = [self.topic.clone(), seq_frame(seq), payload.clone()];
            if let Err(e) = s.send(message(frames)).await {
                tracing::debug!(error = %e, seq, "KV events: batch not sent");
            }
        }
        if let Some(ring) = &self.ring {
            ring.lock().push(seq, payload);
        }
    }

    fn count(&self, events: &[Event]) {
        let s = &self.stats;
        for e in events {
            let n = match e {
                Event::BlockStored { .. } => &s.stored,
                Event::BlockRemoved { .. } => &s.removed,
                Event::AllBlocksCleared => &s.cleared,
            };
            n.fetch_add(1, Relaxed);
        }
    }
}

/// What changes the PUB socket's state (connect mode only).
enum Turn {
    /// A connect in progress is done.
    Connected(Pub),
    /// The router a connected socket reached went away.
    RouterLeft,
}

/// Resolves at the socket's next [`Turn`]; never for a bound socket.
async fn turn(sock: &mut Pub) -> Turn {
    match sock {
        Pub::Connecting(task) => match task.await {
            Ok((s, monitor)) => Turn::Connected(Pub::Ready(s, Some(monitor))),
            // The connect task cannot fail; if it panicked, stay off.
            Err(_) => std::future::pending().await,
        },
        Pub::Ready(_, Some(monitor)) => loop {
            match monitor.next().await {
                Some(SocketEvent::Disconnected(_)) | None => return Turn::RouterLeft,
                Some(_) => {}
            }
        },
        Pub::Ready(_, None) => std::future::pending().await,
    }
}

/// Kept batches, oldest first, within [`REPLAY_BATCHES_MAX`] and
/// [`REPLAY_BYTES_MAX`].
#[derive(Debug, Default)]
struct Ring {
    batches: VecDeque<(u64, Bytes)>,
    bytes: usize,
}

impl Ring {
    fn push(&mut self, seq: u64, payload: Bytes) {
        self.bytes += payload.len();
        self.batches.push_back((seq, payload));
        while self.batches.len() > REPLAY_BATCHES_MAX || self.bytes > REPLAY_BYTES_MAX {
            let Some((_, old)) = self.batches.pop_front() else {
                break;
            };
            self.bytes -= old.len();
        }
    }

    fn since(&self, start: u64) -> Vec<(u64, Bytes)> {
        let first = self.batches.partition_point(|(seq, _)| *seq < start);
        self.batches.range(first..).cloned().collect()
    }
}

/// Answers replay requests, one at a time, until the socket fails.
async fn serve_replay(
    mut router: RouterSocket,
    ring: Arc<Mutex<Ring>>,
    topic: Bytes,
    stats: Arc<Stats>,
) {
    loop {
        let request = match router.recv().await {
            Ok(m) => m.into_vec(),
            Err(e) => {
                tracing::debug!(error = %e, "KV events: replay receive failed");
                tokio::time::sleep(REPLAY_ERROR_DELAY).await;
                continue;
            }
        };
        // [identity, empty delimiter, start seq]: vLLM's request.
        let [client, _, start] = request.as_slice() else {
            tracing::debug!(
                frames = request.len(),
                "KV events: replay request ignored (want 3 frames)"
            );
            continue;
        };
        let Some(start) = seq_of(start) else {
            tracing::debug!(
                bytes = start.len(),
                "KV events: replay request ignored (start seq is not 1 to 8 bytes)"
            );
            continue;
        };
        stats.replays.fetch_add(1, Relaxed);
        let batches = ring.lock().since(start);
        let empty = Bytes::new();
        for (seq, payload) in batches {
            let frames = [
                client.clone(),
                empty.clone(),
                topic.clone(),
                seq_frame(seq),
                payload,
            ];
            if router.send(message(frames)).await.is_err() {
                break;
            }
        }
        let end = [
            client.clone(),
            empty.clone(),
            empty.clone(),
            Bytes::from_static(&END_SEQ),
            empty,
        ];
        let _ = router.send(message(end)).await;
    }
}

/// A big-endian unsigned number of 1 to 8 bytes.
fn seq_of(frame: &[u8]) -> Option<u64> {
    if frame.is_empty() || frame.len() > 8 {
        return None;
    }
    Some(frame.iter().fold(0u64, |n, b| (n << 8) | u64::from(*b)))
}

fn seq_frame(seq: u64) -> Bytes {
    Bytes::copy_from_slice(&seq.to_be_bytes())
}

fn message<const N: usize>(frames: [Bytes; N]) -> ZmqMessage {
    let mut m = ZmqMessage::from(frames[0].clone());
    for f in frames.into_iter().skip(1) {
        m.push_back(f);
    }
    m
}

/// Seconds since the Unix epoch, as vLLM's `time.time()`.
fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_newest_within_its_bounds() {
        let mut r = Ring::default();
        for seq in 0..(REPLAY_BATCHES_MAX as u64 + 5) {
            r.push(seq, Bytes::from_static(b"x"));
        }
        assert_eq!(r.batches.len(), REPLAY_BATCHES_MAX);
        assert_eq!(r.since(0)[0].0, 5);
        assert_eq!(r.since(REPLAY_BATCHES_MAX as u64).len(), 5);
        assert!(r.since(u64::MAX).is_empty());
        r.push(1 << 40, Bytes::from(vec![0u8; REPLAY_BYTES_MAX]));
        assert_eq!(r.batches.len(), 1);
        assert_eq!(seq_of(&[1, 0]), Some(256));
        assert_eq!(seq_of(&[]), None);
        assert_eq!(seq_of(&[0; 9]), None);
    }
}
