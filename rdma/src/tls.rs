//! TLS for strata's TCP connections (rustls, ring provider): loading PEM
//! certificates and keys into server and client configurations, a stream
//! that is either plain TCP or TLS over it, and the bounded accept and
//! connect that every listener and dialer uses.
//!
//! Shared by the node (RESP port, node-to-node calls, data plane) and the
//! SDK, which is why it lives in the transport crate. It knows nothing of
//! RESP: what a refused plaintext client is told is the caller's business.
//! Every handshake is bounded in time, so a client that stalls mid-way
//! holds its connection slot for [`HANDSHAKE_TIMEOUT`] at most.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

pub use rustls::{ClientConfig, ServerConfig};

/// Longest a peer may take to finish a handshake (or, on a TLS port, to
/// send its first byte) before the connection is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The first byte of every TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A configuration problem, naming the setting (`what`) it came from.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{what}: {path}: {msg}")]
    File {
        what: &'static str,
        path: PathBuf,
        msg: String,
    },
    #[error("{what}: {msg}")]
    Invalid { what: &'static str, msg: String },
}

/// Whether the server asks for client certificates (Redis'
/// `tls-auth-clients`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client without a certificate signed by the CA is refused.
    Required,
    /// A client may present one (it must then be valid) or none.
    Optional,
    /// None is asked for.
    Off,
}

/// A PEM file and the setting that named it, for messages.
#[derive(Debug, Clone, Copy)]
pub struct PemFile<'a> {
    pub what: &'static str,
    pub path: &'a Path,
}

/// ring's provider, which rustls 0.23.48 deprecates for lacking a
/// post-quantum key exchange (X25519MLKEM768, in aws-lc-rs's). ring is
/// what builds here with a C compiler alone and what tonic's `tls-ring`
/// (etcd) links already; moving both to aws-lc-rs is one line each.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn file_error(f: PemFile<'_>, msg: impl ToString) -> TlsError {
    TlsError::File {
        what: f.what,
        path: f.path.to_path_buf(),
        msg: msg.to_string(),
    }
}

/// Every certificate in a PEM file; none is an error.
pub fn load_certs(f: PemFile<'_>) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    std::fs::metadata(f.path).map_err(|e| file_error(f, e))?;
    let certs = CertificateDer::pem_file_iter(f.path)
        .map_err(|e| file_error(f, e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error(f, e))?;
    if certs.is_empty() {
        return Err(file_error(f, "no PEM certificate in it"));
    }
    Ok(certs)
}

/// The first private key (PKCS#8, PKCS#1 or SEC1) in a PEM file.
pub fn load_key(f: PemFile<'_>) -> Result<PrivateKeyDer<'static>, TlsError> {
    std::fs::metadata(f.path).map_err(|e| file_error(f, e))?;
    PrivateKeyDer::from_pem_file(f.path)
        .map_err(|e| file_error(f, format!("no usable PEM private key ({e})")))
}

fn roots(ca: PemFile<'_>) -> Result<Arc<RootCertStore>, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in load_certs(ca)? {
        store.add(cert).map_err(|e| file_error(ca, e))?;
    }
    Ok(Arc::new(store))
}

/// A certificate chain and the key that signs for it, checked to match.
fn identity(
    cert: PemFile<'_>,
    key: PemFile<'_>,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), TlsError> {
    let certs = load_certs(cert)?;
    let der = load_key(key)?;
    let signer = provider()
        .key_provider
        .load_private_key(der.clone_key())
        .map_err(|e| file_error(key, e))?;
    let certified = rustls::sign::CertifiedKey::new(certs.clone(), signer);
    certified.keys_match().map_err(|_| TlsError::Invalid {
        what: key.what,
        msg: format!(
            "{} is not the key of the certificate in {} ({})",
            key.path.display(),
            cert.path.display(),
            cert.what
        ),
    })?;
    Ok((certs, der))
}

/// What a TLS listener needs: its certificate and key, and the CA that
/// signs client certificates (needed unless `auth` is `Off`).
#[derive(Debug, Clone, Copy)]
pub struct ServerFiles<'a> {
    pub cert: PemFile<'a>,
    pub key: PemFile<'a>,
    pub ca: Option<PemFile<'a>>,
    pub auth: ClientAuth,
}

pub fn server_config(files: ServerFiles<'_>) -> Result<Arc<ServerConfig>, TlsError> {
    let (certs, key) = identity(files.cert, files.key)?;
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(files.cert.what, e))?;
    let builder = match (files.auth, files.ca) {
        (ClientAuth::Off, _) => builder.with_no_client_auth(),
        (auth, Some(ca)) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca)?, provider());
            let verifier = if auth == ClientAuth::Optional {
                verifier.allow_unauthenticated()
            } else {
                verifier
            };
            builder.with_client_cert_verifier(verifier.build().map_err(|e| invalid(ca.what, e))?)
        }
        (_, None) => {
            return Err(invalid(
                "tls_auth_clients",
                "client certificates need a CA to check them (tls_ca_cert_file)",
            ))
        }
    };
    let cfg = builder
        .with_single_cert(certs, key)
        .map_err(|e| invalid(files.key.what, e))?;
    Ok(Arc::new(cfg))
}

/// What a TLS dialer needs: the CA that signs servers' certificates, and
/// the client's own certificate and key where servers ask for one.
#[derive(Debug, Clone, Copy)]
pub struct ClientFiles<'a> {
    pub ca: PemFile<'a>,
    pub identity: Option<(PemFile<'a>, PemFile<'a>)>,
}

pub fn client_config(files: ClientFiles<'_>) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(files.ca.what, e))?
        .with_root_certificates(roots(files.ca)?);
    let cfg = match files.identity {
        Some((cert, key)) => {
            let (certs, der) = identity(cert, key)?;
            builder
                .with_client_auth_cert(certs, der)
                .map_err(|e| invalid(key.what, e))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Arc::new(cfg))
}

fn invalid(what: &'static str, e: impl ToString) -> TlsError {
    TlsError::Invalid {
        what,
        msg: e.to_string(),
    }
}

/// The name a server's certificate must carry: `host` of `host:port`
/// (an IP address or a DNS name; brackets of IPv6 literals removed).
pub fn server_name(addr: &str) -> std::io::Result<ServerName<'static>> {
    let host = addr.rsplit_once(':').map_or(addr, |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    ServerName::try_from(host.to_string())
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// How an accept on a TLS port ended, when it did not give a stream.
#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    /// The first byte was not a TLS handshake record: a plaintext client.
    #[error("plaintext client on a TLS port")]
    Plaintext(TcpStream),
    #[error("TLS handshake timed out")]
    Timeout,
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
}

/// Accepts TLS on `sock`: peeks at the first byte, so that a plaintext
/// client can be told so (it gets its socket back in
/// [`AcceptError::Plaintext`]), then handshakes; both within `timeout`.
pub async fn accept(
    acceptor: &tokio_rustls::TlsAcceptor,
    sock: TcpStream,
    timeout: Duration,
) -> Result<Stream, AcceptError> {
    let handshake = async {
        let mut first = [0u8; 1];
        let n = sock
            .peek(&mut first)
            .await
            .map_err(AcceptError::Handshake)?;
        if n == 1 && first[0] != TLS_HANDSHAKE_RECORD {
            return Err(AcceptError::Plaintext(sock));
        }
        let tls = acceptor
            .accept(sock)
            .await
            .map_err(AcceptError::Handshake)?;
        Ok(Stream::Tls(Box::new(tls.into())))
    };
    tokio::time::timeout(timeout, handshake)
        .await
        .unwrap_or(Err(AcceptError::Timeout))
}

/// Handshakes as a client on a connected socket, within `timeout`.
pub async fn connect(
    config: &Arc<ClientConfig>,
    name: ServerName<'static>,
    sock: TcpStream,
    timeout: Duration,
) -> std::io::Result<Stream> {
    let connector = tokio_rustls::TlsConnector::from(config.clone());
    let tls = tokio::time::timeout(timeout, connector.connect(name, sock))
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
        })??;
    Ok(Stream::Tls(Box::new(tls.into())))
}

/// A connection, plain or TLS: what listeners hand to connection code and
/// dialers get back.
pub enum Stream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::TlsStream<TcpStream>>),
}

impl Stream {
    /// The TCP socket under it (socket options, addresses, `POLLRDHUP`).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::Tls(_))
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        self.tcp().as_raw_fd()
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
