//! How failures of the lower crates (the transfer engine, the tiers) read
//! on the wire: each one's stable error code. Commands and the tier
//! bring-in both answer with these, so they live below both.

use strata_proto::{CommandError, ErrorCode};

/// Maps data-plane errors to their stable codes.
pub fn transfer_error(e: strata_rdma::TransferError) -> CommandError {
    use strata_rdma::TransferError as T;
    match e {
        T::BadDescriptor(_) => CommandError::new(ErrorCode::BadDesc, e.to_string()),
        T::Stale => CommandError::new(ErrorCode::Stale, e.to_string()),
        T::TooLarge { .. } => CommandError::new(ErrorCode::TooLarge, e.to_string()),
        T::Busy(_) => CommandError::new(ErrorCode::Busy, e.to_string()),
        _ => CommandError::err(format!("io: {e}")),
    }
}

/// Maps store errors to their stable codes.
pub fn store_error(e: strata_tiering::StoreError) -> CommandError {
    use strata_tiering::StoreError;
    match e {
        StoreError::TooLarge { .. } => CommandError::new(ErrorCode::TooLarge, e.to_string()),
        StoreError::NoSpace { .. } => CommandError::new(ErrorCode::NoSpace, e.to_string()),
        StoreError::Arena { .. } => CommandError::err(e.to_string()),
        StoreError::Device(_) => CommandError::err(format!("io: {e}")),
    }
}

/// A descriptor for another data plane than this node's: the client was
/// set up for the wrong `protocol`, which the reply names.
pub fn wrong_transport(
    theirs: strata_rdma::TransportKind,
    ours: strata_rdma::TransportKind,
) -> CommandError {
    CommandError::new(
        ErrorCode::BadDesc,
        format!(
            "descriptor transport {theirs} is not this node's ({ours}): set the client's protocol to {ours} (Rust ClientConfig::protocol, Python ClientConfig(protocol=\"{ours}\"))"
        ),
    )
}
