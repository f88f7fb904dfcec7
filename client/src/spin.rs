//! Opt-in polling for a reply before sleeping (`ClientConfig::spin_us`):
//! each exchange with a node polls its sockets instead of sleeping until
//! that long passes with nothing arriving (see `strata_rdma::spin`). The
//! node's side of the same wait is its `busy_poll_us`.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::time::Duration;

use strata_rdma::spin::Spinner;

/// Most a call may spin (`spin_us` ≤ 1000).
pub const SPIN_MAX: Duration = Duration::from_millis(1);

/// Runs `f`, spinning while it keeps being woken within `spin` when a
/// quarter of the cores (shared by every client of this process) are not
/// spinning already. `f` comes pinned so that only the caller holds it
/// (see `Spinner::run`).
pub(crate) async fn spun<F: Future + ?Sized>(f: Pin<&mut F>, spin: Duration) -> F::Output {
    static SPINNER: OnceLock<Spinner> = OnceLock::new();
    let spinner = SPINNER.get_or_init(|| {
        Spinner::quarter_of(std::thread::available_parallelism().map_or(1, |n| n.get()))
    });
    spinner.run(f, spin, || {}).await.0
}
