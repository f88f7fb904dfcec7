//! The transfers behind the zero-copy calls: each target registered with
//! the data plane for the duration of its call, batches in chunks of
//! `BATCH_MAX` so the region table stays bounded. Knows nothing of Python.

use std::ops::Range;

use strata_client::{Buffer, Client, Error, BATCH_MAX};

use crate::target::Span;

/// Registers `span` for one call.
fn register(c: &Client, span: Span) -> Result<Buffer, Error> {
    // SAFETY: the span is a live Python buffer export, a registered buffer
    // or a tensor the caller holds (checked by python/strata/client.py); it
    // stays valid until the call that registered it returns, and the
    // buffer is closed (no read of it in flight) before then.
    unsafe { c.register_raw(span.ptr(), span.len) }
}

pub async fn put_one(c: &Client, key: &[u8], span: Span) -> Result<(), Error> {
    let buf = register(c, span)?;
    let put = c.put_from(key, &buf, 0..span.len).await;
    buf.close().await;
    put
}

pub async fn get_one(c: &Client, key: &[u8], span: Span) -> Result<usize, Error> {
    let mut buf = register(c, span)?;
    let read = c.get_into(key, &mut buf, 0).await;
    buf.close().await;
    read
}

/// A chunk's spans registered: per span the buffer, or why it failed
/// (that item then fails alone).
fn register_all(c: &Client, spans: &[Span]) -> (Vec<Option<Buffer>>, Vec<Option<Error>>) {
    spans
        .iter()
        .map(|s| match register(c, *s) {
            Ok(b) => (Some(b), None),
            Err(e) => (None, Some(e)),
        })
        .unzip()
}

async fn close_all(bufs: Vec<Option<Buffer>>) {
    for b in bufs.into_iter().flatten() {
        b.close().await;
    }
}

/// Per item: its registration error, else the next result of the batch
/// call (which saw only the registered items, in order).
fn merge<T>(failed: Vec<Option<Error>>, done: Vec<Result<T, Error>>) -> Vec<Result<T, Error>> {
    let mut done = done.into_iter();
    failed
        .into_iter()
        .map(|f| match f {
            Some(e) => Err(e),
            None => done
                .next()
                .unwrap_or_else(|| Err(Error::Protocol("batch returned too few results".into()))),
        })
        .collect()
}

/// `put_many` chunk by chunk, so at most `BATCH_MAX` targets are
/// registered at once.
pub async fn put_batch(c: &Client, keys: &[Vec<u8>], spans: &[Span]) -> Vec<Result<(), Error>> {
    let mut out = Vec::with_capacity(keys.len());
    for (keys, spans) in keys.chunks(BATCH_MAX).zip(spans.chunks(BATCH_MAX)) {
        let (bufs, failed) = register_all(c, spans);
        let items: Vec<(&[u8], &Buffer, Range<usize>)> = keys
            .iter()
            .zip(&bufs)
            .filter_map(|(k, b)| b.as_ref().map(|b| (k.as_slice(), b, 0..b.len())))
            .collect();
        let done = c.put_many(&items).await;
        drop(items);
        out.extend(merge(failed, done));
        close_all(bufs).await;
    }
    out
}

/// `get_many` chunk by chunk (see [`put_batch`]).
pub async fn get_batch(c: &Client, keys: &[Vec<u8>], spans: &[Span]) -> Vec<Result<usize, Error>> {
    let mut out = Vec::with_capacity(keys.len());
    for (keys, spans) in keys.chunks(BATCH_MAX).zip(spans.chunks(BATCH_MAX)) {
        let (mut bufs, failed) = register_all(c, spans);
        let mut items: Vec<(&[u8], &mut Buffer, usize)> = keys
            .iter()
            .zip(bufs.iter_mut())
            .filter_map(|(k, b)| b.as_mut().map(|b| (k.as_slice(), b, 0)))
            .collect();
        let done = c.get_many(&mut items).await;
        drop(items);
        out.extend(merge(failed, done));
        close_all(bufs).await;
    }
    out
}
