//! `strata._native`: the PyO3 layer between Python and `strata-client`.
//!
//! It owns a tokio runtime and one [`strata_client::Client`], and exposes
//! the client's operations with the GIL released for the whole network
//! round trip. It never speaks the protocol or routes keys itself: every
//! byte on the wire comes from `strata-client`.
//!
//! This module is private. It trusts the integer pointers it is given; the
//! public `strata.Client` (python/strata/client.py) checks them against the
//! registered buffers first.

mod client;
mod driver;
mod errors;
mod target;
mod transfer;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<client::NativeClient>()?;
    m.add("BATCH_MAX", strata_client::BATCH_MAX)?;
    m.add("KEY_BYTES_MAX", target::KEY_BYTES_MAX)?;
    Ok(())
}
