//! Polling for a reply instead of sleeping: each exchange with a node
//! polls its sockets until a window passes with nothing arriving (see
//! `strata_rdma::spin`). Before the reply begins the window is
//! `ClientConfig::spin_us` (opt-in), once it is arriving
//! `stream_spin_us` (on by default). The node's side of the same waits
//! are its `busy_poll_us` and `stream_poll_us`.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

/// Most a call may spin (`spin_us`, `stream_spin_us` ≤ 1000).
pub const SPIN_MAX: Duration = Duration::from_millis(1);

/// `ClientConfig::stream_spin_us` unless set.
pub const DEFAULT_STREAM_SPIN_US: u64 = strata_rdma::spin::STREAM_US_DEFAULT;

/// `ClientConfig::echo_spin_us` unless set.
pub const DEFAULT_ECHO_SPIN_US: u64 = strata_rdma::spin::ECHO_US_DEFAULT;

/// The polling windows of a client's exchanges with a node.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Windows {
    /// `ClientConfig::spin_us`: before a reply begins.
    pub spin: Duration,
    /// `ClientConfig::stream_spin_us`: once it is arriving.
    pub stream: Duration,
    /// `ClientConfig::echo_spin_us`: the cap on the wait after a long
    /// request write (see `strata_rdma::spin::echo`).
    pub echo: Duration,
}

impl Windows {
    pub(crate) fn of(cfg: &crate::ClientConfig) -> Self {
        Self {
            spin: Duration::from_micros(cfg.spin_us),
            stream: Duration::from_micros(cfg.stream_spin_us),
            echo: Duration::from_micros(cfg.echo_spin_us),
        }
    }
}

/// Runs `f`, spinning while it keeps being woken within `spin` (before
/// its first wake-up) or `stream` (after it) when a quarter of the cores
/// (shared by every client of this process) are not spinning already.
/// `f` comes pinned so that only the caller holds it (see
/// `Spinner::run`).
pub(crate) async fn spun<F: Future + ?Sized>(
    f: Pin<&mut F>,
    spin: Duration,
    stream: Duration,
) -> F::Output {
    strata_rdma::spin::shared()
        .run(f, spin, stream, || {})
        .await
        .0
}
