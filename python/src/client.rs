//! `NativeClient`: one `strata_client::Client` on a private tokio runtime.
//! Every method converts its arguments with the GIL held, then runs the
//! network part with the GIL released, then builds Python results.
//!
//! Zero-copy targets are registered with the client's data plane only for
//! the duration of the call that uses them (see `transfer`), so no memory
//! stays readable by peers after the call returns.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use strata_client::{Client, ClientConfig, Error, Protocol, TlsOptions, BATCH_MAX};

use crate::driver::Driver;
use crate::errors::{error_value, internal, invalid, to_pyerr};
use crate::target::{key_bytes, keys_bytes, targets, Span, Target};
use crate::transfer::{get_batch, get_one, put_batch, put_one};

/// Most runtime worker threads: transfers are I/O bound, and the client
/// pools at most 4 data-plane connections per peer.
const THREADS_MAX: usize = 64;

/// The client and the runtime it runs on; `None` once closed.
struct Inner {
    client: Arc<Client>,
    rt: Arc<Driver>,
}

#[pyclass(module = "strata._native", frozen)]
pub struct NativeClient {
    inner: Mutex<Option<Inner>>,
}

impl NativeClient {
    /// The client and runtime for one call (cheap clones), or an error if
    /// the client was closed.
    fn parts(&self) -> PyResult<(Arc<Client>, Arc<Driver>)> {
        let guard = self
            .inner
            .lock()
            .map_err(|_| invalid("client lock poisoned"))?;
        match guard.as_ref() {
            Some(i) => Ok((i.client.clone(), i.rt.clone())),
            None => Err(invalid("the client is closed")),
        }
    }

    /// Runs `f` on this thread, with the GIL released: it drives the
    /// sockets itself while it waits, or with `threads >= 1` the runtime's
    /// workers do (see `driver`). Most calls are one round trip (values
    /// up to 1 MiB travel with the command over TCP; cross-memory-attach
    /// copies run right here). A spawned task would cost one more
    /// cross-thread wake-up per call (a worker to start it) and run every
    /// copy on the runtime's few workers (docs/bench-notes/python-sdk.md).
    fn run<T, F, Fut>(&self, py: Python<'_>, f: F) -> PyResult<T>
    where
        T: Send,
        F: FnOnce(Arc<Client>) -> Fut + Send,
        Fut: std::future::Future<Output = T> + Send,
    {
        let (client, rt) = self.parts()?;
        // Boxed once: the op's future is several KiB, and by value each
        // closure and `block_on` below would copy it again.
        let op = Box::pin(f(client));
        // A panic is reported as a failure of this call, as when it ran
        // as a task, never carried into the interpreter.
        let run = std::panic::AssertUnwindSafe(move || rt.block_on(op));
        py.allow_threads(move || std::panic::catch_unwind(run))
            .map_err(|_| internal("the operation panicked (see the log)"))
    }
}

/// The data plane a `protocol` option names. RDMA needs a wheel built with
/// the `rdma` feature: without it, say so here rather than let the nodes
/// refuse every descriptor.
fn data_plane(protocol: &str, device: Option<String>, fallback_tcp: bool) -> PyResult<Protocol> {
    match protocol.trim() {
        "tcp" => Ok(Protocol::Tcp),
        "rdma" if !cfg!(feature = "rdma") => Err(invalid(
            "protocol=\"rdma\": this strata wheel was built without RDMA; install it with \
             MATURIN_PEP517_ARGS=\"--features rdma\" pip install ./python (see python/README.md)",
        )),
        "rdma" => Ok(Protocol::Rdma {
            device_name: device.filter(|d| !d.trim().is_empty()),
            fallback_tcp,
        }),
        other => Err(invalid(format!(
            "protocol {other:?} is not a data plane (allowed: tcp, rdma)"
        ))),
    }
}

/// TLS to the nodes when `ca_file` is given (empty counts as not given);
/// a certificate, its key or a server name without a CA is refused, as is
/// a certificate without its key.
fn tls_options(
    ca_file: Option<String>,
    cert_file: Option<String>,
    key_file: Option<String>,
    server_name: Option<String>,
) -> PyResult<Option<TlsOptions>> {
    let given = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
    let (cert_file, key_file, server_name) =
        (given(cert_file), given(key_file), given(server_name));
    let Some(ca_file) = given(ca_file) else {
        if cert_file.is_some() || key_file.is_some() || server_name.is_some() {
            return Err(invalid(
                "tls_cert_file, tls_key_file and tls_server_name need tls_ca_file \
                 (the CA that signs the nodes' certificates), which turns TLS on",
            ));
        }
        return Ok(None);
    };
    if cert_file.is_some() != key_file.is_some() {
        return Err(invalid("tls_cert_file and tls_key_file go together"));
    }
    Ok(Some(TlsOptions {
        ca_file: ca_file.into(),
        cert_file: cert_file.map(Into::into),
        key_file: key_file.map(Into::into),
        server_name,
    }))
}

#[pymethods]
impl NativeClient {
    #[new]
    #[pyo3(signature = (seeds, data_bind, retry_attempts, timeout_ms, failover,
                        failover_timeout_ms, health_check_interval_ms, threads, cma=true,
                        inline_get_max=strata_client::DEFAULT_INLINE_GET_MAX,
                        inline_put_max=strata_client::DEFAULT_INLINE_PUT_MAX,
                        tcp_congestion=None, cma_lanes=strata_client::DEFAULT_CMA_LANES,
                        split_get_min=strata_client::DEFAULT_SPLIT_GET_MIN, spin_us=0,
                        stream_spin_us=strata_client::DEFAULT_STREAM_SPIN_US,
                        echo_spin_us=strata_client::DEFAULT_ECHO_SPIN_US,
                        data_advertise=None, protocol="tcp", rdma_device=None,
                        rdma_fallback_tcp=false, tls_ca_file=None, tls_cert_file=None,
                        tls_key_file=None, tls_server_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        seeds: Vec<String>,
        data_bind: &str,
        retry_attempts: u32,
        timeout_ms: u64,
        failover: bool,
        failover_timeout_ms: u64,
        health_check_interval_ms: u64,
        threads: usize,
        cma: bool,
        inline_get_max: u64,
        inline_put_max: u64,
        tcp_congestion: Option<String>,
        cma_lanes: usize,
        split_get_min: u64,
        spin_us: u64,
        stream_spin_us: u64,
        echo_spin_us: u64,
        data_advertise: Option<String>,
        protocol: &str,
        rdma_device: Option<String>,
        rdma_fallback_tcp: bool,
        tls_ca_file: Option<String>,
        tls_cert_file: Option<String>,
        tls_key_file: Option<String>,
        tls_server_name: Option<String>,
    ) -> PyResult<Self> {
        if seeds.is_empty() {
            return Err(invalid("at least one seed address is required"));
        }
        if threads > THREADS_MAX {
            return Err(invalid(format!(
                "threads must be in 0..={THREADS_MAX} (0: the calling threads drive the sockets)"
            )));
        }
        let lanes_max = strata_client::CMA_LANES_MAX;
        if cma_lanes == 0 || cma_lanes > lanes_max {
            return Err(invalid(format!("cma_lanes must be in 1..={lanes_max}")));
        }
        let mut cfg = ClientConfig::with_seeds(seeds);
        // Empty: the Rust client's default (`STRATA_DATA_BIND`, else the
        // route to the seeds), resolved when it connects.
        cfg.data_bind = match data_bind.trim() {
            "" => None,
            text => Some(
                text.parse()
                    .map_err(|_| invalid(format!("data_bind {data_bind:?} is not an ip:port")))?,
            ),
        };
        cfg.data_advertise = data_advertise.filter(|host| !host.trim().is_empty());
        cfg.protocol = data_plane(protocol, rdma_device, rdma_fallback_tcp)?;
        cfg.tls = tls_options(tls_ca_file, tls_cert_file, tls_key_file, tls_server_name)?;
        cfg.retry_attempts = retry_attempts;
        cfg.timeout = Duration::from_millis(timeout_ms);
        cfg.failover_enabled = failover;
        cfg.failover_timeout_ms = failover_timeout_ms;
        cfg.health_check_interval_ms = health_check_interval_ms;
        cfg.cma = cma;
        cfg.cma_lanes = cma_lanes;
        cfg.inline_get_max = inline_get_max;
        cfg.inline_put_max = inline_put_max;
        cfg.split_get_min = split_get_min;
        cfg.tcp_congestion = tcp_congestion.filter(|name| !name.is_empty());
        let max = strata_client::SPIN_MAX.as_micros() as u64;
        for (name, us) in [
            ("spin_us", spin_us),
            ("stream_spin_us", stream_spin_us),
            ("echo_spin_us", echo_spin_us),
        ] {
            if us > max {
                return Err(invalid(format!("{name} must be in 0..={max}")));
            }
        }
        // Mid-transfer and right after a long write, whichever thread
        // drives the sockets: it is busy with the transfer either way.
        cfg.stream_spin_us = stream_spin_us;
        cfg.echo_spin_us = echo_spin_us;
        // Worker threads poll the sockets themselves: a spinning caller
        // would only take a core from them.
        cfg.spin_us = if threads == 0 { spin_us } else { 0 };
        let rt = Driver::new(threads).map_err(|e| to_pyerr(Error::Io(e)))?;
        let client = py
            .allow_threads(|| rt.block_on(Client::connect_with(cfg)))
            .map_err(to_pyerr)?;
        Ok(Self {
            inner: Mutex::new(Some(Inner {
                client: Arc::new(client),
                rt: Arc::new(rt),
            })),
        })
    }

    /// Stops the client: its connections, health checks and data plane.
    /// Idempotent; calls still running finish first.
    fn close(&self, py: Python<'_>) {
        let taken = self.inner.lock().ok().and_then(|mut g| g.take());
        if let Some(Inner { client, rt }) = taken {
            drop(client);
            if let Ok(driver) = Arc::try_unwrap(rt) {
                py.allow_threads(move || {
                    if let Ok(rt) = Arc::try_unwrap(driver.into_runtime()) {
                        rt.shutdown_timeout(Duration::from_secs(5));
                    }
                });
            }
        }
    }

    fn is_closed(&self) -> bool {
        self.inner.lock().map(|g| g.is_none()).unwrap_or(true)
    }

    /// Inline `SET`: the value travels on the command connection.
    fn set(&self, py: Python<'_>, key: &Bound<'_, PyAny>, value: &[u8]) -> PyResult<()> {
        let key = key_bytes(key)?;
        let value = Bytes::copy_from_slice(value);
        self.run(py, |c| async move { c.set(&key, &value).await })?
            .map_err(to_pyerr)
    }

    /// Inline `SET` of each pair, concurrently: per key `None` or the
    /// exception.
    fn set_batch(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        values: Vec<Bound<'_, PyBytes>>,
    ) -> PyResult<Vec<PyObject>> {
        if keys.len() != values.len() {
            return Err(invalid(format!(
                "{} keys for {} values",
                keys.len(),
                values.len()
            )));
        }
        let keys = keys_bytes(&keys)?;
        let values: Vec<Bytes> = values
            .iter()
            .map(|v| Bytes::copy_from_slice(v.as_bytes()))
            .collect();
        let done = self.run(py, |c| async move {
            let mut out = Vec::with_capacity(keys.len());
            for (keys, values) in keys.chunks(BATCH_MAX).zip(values.chunks(BATCH_MAX)) {
                let sets = keys.iter().zip(values).map(|(k, v)| c.set(k, v));
                out.extend(futures::future::join_all(sets).await);
            }
            out
        })?;
        Ok(done
            .into_iter()
            .map(|r| match r {
                Ok(()) => py.None(),
                Err(e) => error_value(py, &e),
            })
            .collect())
    }

    /// Inline `GET`: the value or `None`.
    fn get(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<PyObject>> {
        let key = key_bytes(key)?;
        let value = self
            .run(py, |c| async move { c.get(&key).await })?
            .map_err(to_pyerr)?;
        Ok(value.map(|v| PyBytes::new(py, &v).into_any().unbind()))
    }

    /// Inline `GET` of each key, concurrently: per key bytes, `None`, or
    /// the exception.
    fn get_batch(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<PyObject>> {
        let keys = keys_bytes(&keys)?;
        let values = self.run(py, |c| async move {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(BATCH_MAX) {
                let gets = chunk.iter().map(|k| c.get(k));
                out.extend(futures::future::join_all(gets).await);
            }
            out
        })?;
        Ok(values
            .into_iter()
            .map(|v| match v {
                Ok(Some(b)) => PyBytes::new(py, &b).into_any().unbind(),
                Ok(None) => py.None(),
                Err(e) => error_value(py, &e),
            })
            .collect())
    }

    fn exists(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_bytes(key)?;
        self.run(py, |c| async move { c.exists(&key).await })?
            .map_err(to_pyerr)
    }

    /// `EXISTS` of each key, concurrently: per key a bool or the exception.
    fn exists_batch(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<Vec<PyObject>> {
        let keys = keys_bytes(&keys)?;
        let found = self.run(py, |c| async move {
            let mut out = Vec::with_capacity(keys.len());
            for chunk in keys.chunks(BATCH_MAX) {
                let asks = chunk.iter().map(|k| c.exists(k));
                out.extend(futures::future::join_all(asks).await);
            }
            out
        })?;
        found
            .into_iter()
            .map(|r| match r {
                Ok(b) => Ok(pyo3::types::PyBool::new(py, b)
                    .to_owned()
                    .into_any()
                    .unbind()),
                Err(e) => Ok(error_value(py, &e)),
            })
            .collect()
    }

    /// Length of the value of `key`, `None` if absent (no payload moves).
    fn value_size(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let key = key_bytes(key)?;
        self.run(py, |c| async move { c.value_size(&key).await })?
            .map_err(to_pyerr)
    }

    /// How many keys, from the first, are all present.
    fn prefix(&self, py: Python<'_>, keys: Vec<Bound<'_, PyAny>>) -> PyResult<usize> {
        let keys = keys_bytes(&keys)?;
        self.run(py, |c| async move { c.prefix(&keys).await })?
            .map_err(to_pyerr)
    }

    /// `DEL`: whether the key existed.
    fn remove(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        let key = key_bytes(key)?;
        self.run(py, |c| async move { c.del(&key).await })?
            .map_err(to_pyerr)
    }

    #[pyo3(signature = (section="default"))]
    fn info(&self, py: Python<'_>, section: &str) -> PyResult<String> {
        let section = section.to_owned();
        self.run(py, |c| async move { c.info(&section).await })?
            .map_err(to_pyerr)
    }

    /// Keys matching the glob `pattern` on every node, at most `limit`.
    fn scan(&self, py: Python<'_>, pattern: &[u8], limit: usize) -> PyResult<Vec<PyObject>> {
        let pattern = pattern.to_vec();
        let keys = self
            .run(py, |c| async move { c.scan(&pattern, limit).await })?
            .map_err(to_pyerr)?;
        Ok(keys
            .iter()
            .map(|k| PyBytes::new(py, k).into_any().unbind())
            .collect())
    }

    /// Stores `target[..size]` under `key`; the node pulls the bytes.
    #[pyo3(signature = (key, target, size=None))]
    fn put_from(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        target: &Bound<'_, PyAny>,
        size: Option<usize>,
    ) -> PyResult<()> {
        let key = key_bytes(key)?;
        let target = Target::extract(target, size, false)?;
        let span = target.span;
        let done = self.run(py, |c| async move { put_one(&c, &key, span).await })?;
        drop(target);
        done.map_err(to_pyerr)
    }

    /// Reads the value of `key` into `target[..size]`; returns its length.
    #[pyo3(signature = (key, target, size=None))]
    fn get_into(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        target: &Bound<'_, PyAny>,
        size: Option<usize>,
    ) -> PyResult<usize> {
        let key = key_bytes(key)?;
        let target = Target::extract(target, size, true)?;
        let span = target.span;
        let read = self.run(py, |c| async move { get_one(&c, &key, span).await })?;
        drop(target);
        read.map_err(to_pyerr)
    }

    /// Puts every `(key, target)`: per key `None` or the exception.
    #[pyo3(signature = (keys, targets_, sizes=None))]
    fn batch_put_from(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        targets_: Vec<Bound<'_, PyAny>>,
        sizes: Option<Vec<usize>>,
    ) -> PyResult<Vec<PyObject>> {
        let (keys, held) = batch_args(&keys, &targets_, sizes, false)?;
        let spans: Vec<Span> = held.iter().map(|t| t.span).collect();
        let results = self.run(py, |c| async move { put_batch(&c, &keys, &spans).await })?;
        drop(held);
        Ok(results
            .into_iter()
            .map(|r| match r {
                Ok(()) => py.None(),
                Err(e) => error_value(py, &e),
            })
            .collect())
    }

    /// Reads every `(key, target)`: per key the length read or the exception.
    #[pyo3(signature = (keys, targets_, sizes=None))]
    fn batch_get_into(
        &self,
        py: Python<'_>,
        keys: Vec<Bound<'_, PyAny>>,
        targets_: Vec<Bound<'_, PyAny>>,
        sizes: Option<Vec<usize>>,
    ) -> PyResult<Vec<PyObject>> {
        let (keys, held) = batch_args(&keys, &targets_, sizes, true)?;
        let spans: Vec<Span> = held.iter().map(|t| t.span).collect();
        let results = self.run(py, |c| async move { get_batch(&c, &keys, &spans).await })?;
        drop(held);
        results
            .into_iter()
            .map(|r| match r {
                Ok(n) => Ok(n.into_pyobject(py)?.into_any().unbind()),
                Err(e) => Ok(error_value(py, &e)),
            })
            .collect()
    }

    /// RESP address of the node owning `key` in the current slot map.
    fn owner_of(&self, key: &Bound<'_, PyAny>) -> PyResult<Option<String>> {
        let key = key_bytes(key)?;
        Ok(self.parts()?.0.owner_of(&key))
    }

    fn cluster_nodes(&self) -> PyResult<Vec<String>> {
        Ok(self.parts()?.0.cluster_nodes())
    }

    /// `host:port` of this client's data-plane listener.
    fn data_endpoint(&self) -> PyResult<String> {
        Ok(self.parts()?.0.data_endpoint().to_owned())
    }

    /// This client's own cross-memory-attach reads: (reads, bytes,
    /// errors, lane pieces, misaligned reads), zeros when it cannot use it.
    fn cma_stats(&self) -> PyResult<(u64, u64, u64, u64, u64)> {
        use std::sync::atomic::Ordering::Relaxed;
        Ok(match self.parts()?.0.cma_stats() {
            Some(s) => (
                s.reads.load(Relaxed),
                s.bytes.load(Relaxed),
                s.errors.load(Relaxed),
                s.lane_pieces.load(Relaxed),
                s.misaligned.load(Relaxed),
            ),
            None => (0, 0, 0, 0, 0),
        })
    }
}

fn batch_args(
    keys: &[Bound<'_, PyAny>],
    objs: &[Bound<'_, PyAny>],
    sizes: Option<Vec<usize>>,
    writable: bool,
) -> PyResult<(Vec<Vec<u8>>, Vec<Target>)> {
    if keys.len() != objs.len() {
        return Err(invalid(format!(
            "{} keys for {} buffers",
            keys.len(),
            objs.len()
        )));
    }
    Ok((keys_bytes(keys)?, targets(objs, sizes, writable)?))
}
