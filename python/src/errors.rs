//! Maps `strata_client::Error` to the exception classes of `strata.errors`
//! (one class per stable code, all under `StrataError`). The classes live in
//! Python so they can also derive from `KeyError`, `ValueError`, `OSError`.

use pyo3::prelude::*;
use strata_client::Error;

/// Exception class name in `strata.errors` and the code word it carries.
fn class_of(e: &Error) -> (&'static str, &str) {
    match e {
        Error::NotFound => ("NotFoundError", "NOTFOUND"),
        Error::TooLarge(_) => ("TooLargeError", "TOOLARGE"),
        Error::Stale(_) => ("StaleError", "STALE"),
        Error::BadDescriptor(_) => ("BadDescriptorError", "BADDESC"),
        Error::NoSpace(_) => ("NoSpaceError", "NOSPACE"),
        Error::Busy(_) => ("BusyError", "BUSY"),
        Error::Moved { .. } => ("MovedError", "MOVED"),
        Error::Io(_) => ("IoError", "IO"),
        Error::Protocol(_) => ("ProtocolError", "PROTOCOL"),
        Error::Server { code, .. } => ("ServerError", code),
        Error::Invalid(_) => ("InvalidArgumentError", "INVALID"),
    }
}

/// An instance of `strata.errors.<class_name>` with `message`; `code` is
/// set on the instance too (it varies for `ServerError`).
fn instance(py: Python<'_>, class_name: &str, code: &str, message: String) -> PyResult<PyObject> {
    let value = py
        .import("strata.errors")?
        .getattr(class_name)?
        .call1((message,))?;
    value.setattr("code", code)?;
    Ok(value.unbind())
}

/// The exception object for `e`, to return inside a batch's result list.
pub fn error_value(py: Python<'_>, e: &Error) -> PyObject {
    let (class_name, code) = class_of(e);
    match instance(py, class_name, code, e.to_string()) {
        Ok(v) => v,
        // Only if `strata.errors` cannot be imported: still an exception.
        Err(import_failed) => import_failed.into_value(py).into_any(),
    }
}

/// `e` as a raised exception.
pub fn to_pyerr(e: Error) -> PyErr {
    Python::with_gil(|py| PyErr::from_value(error_value(py, &e).into_bound(py)))
}

/// `strata.errors.InvalidArgumentError(message)` for a bad call.
pub fn invalid(message: impl Into<String>) -> PyErr {
    Python::with_gil(
        |py| match instance(py, "InvalidArgumentError", "INVALID", message.into()) {
            Ok(v) => PyErr::from_value(v.into_bound(py)),
            Err(import_failed) => import_failed,
        },
    )
}

/// `strata.errors.StrataError(message)` for a failure inside the extension
/// itself (a panicked task), which no stable code describes.
pub fn internal(message: impl Into<String>) -> PyErr {
    Python::with_gil(
        |py| match instance(py, "StrataError", "INTERNAL", message.into()) {
            Ok(v) => PyErr::from_value(v.into_bound(py)),
            Err(import_failed) => import_failed,
        },
    )
}
