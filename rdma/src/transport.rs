//! The boundary every data plane implements: register memory, pull bytes.

use std::future::Future;
use std::sync::Arc;

use crate::{Descriptor, ReadGuard, Region, TransferError, TransportKind};

/// One read of a batch: `src` into `dst` at `dst_offset`.
#[derive(Clone, Copy)]
pub struct ReadOp<'a> {
    pub src: &'a Descriptor,
    pub dst: &'a Region,
    pub dst_offset: u64,
}

/// A one-sided transfer engine.
///
/// `read` returns `impl Future + Send` (return-position `impl Trait` in
/// traits) rather than a boxed future: a read is the hot path and this keeps
/// it allocation-free. The price is that the trait is not object-safe, so
/// users are generic over `T: Transport`; the transport is chosen once at
/// start-up from config, so an enum over the concrete transports gives
/// runtime choice without `dyn`. Implementations may write `async fn read`.
pub trait Transport: Send + Sync + 'static {
    /// Which data plane this is; descriptors of another kind are refused.
    fn kind(&self) -> TransportKind;

    /// `host:port` of this process's data-plane listener, as put in
    /// descriptors for its regions.
    fn endpoint(&self) -> &str;

    /// Registers `[addr, addr + len)` so peers can read it and local reads
    /// can land in it. `guard`, if any, is asked before each read of it is
    /// served.
    ///
    /// # Safety
    /// The memory must be valid for reads and writes of `len` bytes until the
    /// returned [`Region`] is dropped and no read of it is being served
    /// anymore ([`Region::close`] waits for that). While a transfer into or
    /// out of a range is in flight, nothing else may write (or, for
    /// transfers into it, read) that range.
    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError>;

    /// Pulls `src.len` bytes named by `src` into `dst` at `dst_offset`.
    ///
    /// On error the destination range holds unspecified bytes: callers
    /// must not treat any of it as data.
    fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> impl Future<Output = Result<(), TransferError>> + Send;

    /// Runs every read of `ops`; one result per read, in order, each as
    /// [`Transport::read`] would give it. The TCP transport sends all the
    /// reads for one peer at once on each connection it uses (one round
    /// trip for the batch, not one per read); this default runs them
    /// concurrently.
    fn read_many<'a>(
        &'a self,
        ops: &'a [ReadOp<'a>],
    ) -> impl Future<Output = Vec<Result<(), TransferError>>> + Send + 'a {
        futures::future::join_all(
            ops.iter()
                .map(|op| self.read(op.src, op.dst, op.dst_offset)),
        )
    }

    /// Descriptor a peer can use to read `[offset, offset + len)` of
    /// `region` from this process.
    fn describe(
        &self,
        region: &Region,
        offset: u64,
        len: u64,
        epoch: Option<u64>,
    ) -> Result<Descriptor, TransferError> {
        let start = region.slice_ptr(offset, len)? as u64;
        Ok(Descriptor {
            transport: self.kind(),
            endpoint: self.endpoint().to_owned(),
            addr: start,
            len,
            rkey: region.rkey(),
            epoch,
        })
    }
}

/// Transports are shared (`TcpTransport::bind` returns an `Arc`), so a
/// shared one is a transport too; this lets wrappers such as
/// [`crate::faulty::FaultyTransport`] take either.
impl<T: Transport> Transport for Arc<T> {
    fn kind(&self) -> TransportKind {
        (**self).kind()
    }

    fn endpoint(&self) -> &str {
        (**self).endpoint()
    }

    unsafe fn register(
        &self,
        addr: u64,
        len: u64,
        guard: Option<Arc<dyn ReadGuard>>,
    ) -> Result<Region, TransferError> {
        // SAFETY: same contract, passed through unchanged.
        unsafe { (**self).register(addr, len, guard) }
    }

    fn read(
        &self,
        src: &Descriptor,
        dst: &Region,
        dst_offset: u64,
    ) -> impl Future<Output = Result<(), TransferError>> + Send {
        (**self).read(src, dst, dst_offset)
    }

    fn read_many<'a>(
        &'a self,
        ops: &'a [ReadOp<'a>],
    ) -> impl Future<Output = Vec<Result<(), TransferError>>> + Send + 'a {
        (**self).read_many(ops)
    }
}
