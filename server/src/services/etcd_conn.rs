//! How this node connects to etcd: TLS (`etcd_ca_cert_file`, with a client
//! certificate from `etcd_cert_file`/`etcd_key_file` where etcd asks for
//! one) and authentication (`etcd_user`/`etcd_password`). The one place
//! that builds an etcd client, so every session (membership, leave) talks
//! to etcd the same way.

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::config::Config;

/// Connects with `opts` plus this node's TLS and credentials.
pub async fn connect(cfg: &Config, opts: ConnectOptions) -> Result<Client, etcd_client::Error> {
    let opts = with_credentials(cfg, opts).map_err(etcd_client::Error::InvalidArgs)?;
    Client::connect(endpoints(cfg), Some(opts)).await
}

/// `metadata_server`'s endpoints, `https://` when etcd is reached over TLS
/// (tonic speaks TLS only to an `https` URI).
fn endpoints(cfg: &Config) -> Vec<String> {
    if cfg.etcd_ca_cert_file.is_empty() {
        return cfg.metadata_server.clone();
    }
    let https = |ep: &String| format!("https://{}", ep.trim_start_matches("http://"));
    cfg.metadata_server.iter().map(https).collect()
}

fn with_credentials(cfg: &Config, mut opts: ConnectOptions) -> Result<ConnectOptions, String> {
    if !cfg.etcd_user.is_empty() {
        let password = cfg.etcd_password.clone().unwrap_or_default();
        opts = opts.with_user(cfg.etcd_user.clone(), password);
    }
    if cfg.etcd_ca_cert_file.is_empty() {
        return Ok(opts);
    }
    let ca = read(&cfg.etcd_ca_cert_file, "etcd_ca_cert_file")?;
    let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(ca));
    if !cfg.etcd_cert_file.is_empty() {
        let cert = read(&cfg.etcd_cert_file, "etcd_cert_file")?;
        let key = read(&cfg.etcd_key_file, "etcd_key_file")?;
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Ok(opts.with_tls(tls))
}

fn read(path: &str, key: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{key}: {path}: {e}"))
}

/// Checks the etcd settings at load; a problem names its key.
pub fn check(cfg: &Config) -> Result<(), String> {
    let fail = |m: String| Err(format!("invalid configuration:\n  {m}"));
    let bad = |e: strata_rdma::tls::TlsError| format!("invalid configuration:\n  {e}");
    let tls_set = !cfg.etcd_cert_file.is_empty() || !cfg.etcd_key_file.is_empty();
    if tls_set && (cfg.etcd_cert_file.is_empty() || cfg.etcd_key_file.is_empty()) {
        return fail("etcd_cert_file: needs etcd_key_file, and the other way round".into());
    }
    if tls_set && cfg.etcd_ca_cert_file.is_empty() {
        return fail("etcd_cert_file: needs etcd_ca_cert_file (etcd over TLS)".into());
    }
    if cfg.etcd_password.is_some() && cfg.etcd_user.is_empty() {
        return fail("etcd_password: needs etcd_user".into());
    }
    if !cfg.etcd_ca_cert_file.is_empty() {
        let ca = strata_rdma::tls::PemFile {
            what: "etcd_ca_cert_file",
            path: cfg.etcd_ca_cert_file.as_ref(),
        };
        strata_rdma::tls::load_certs(ca).map_err(bad)?;
    }
    if tls_set {
        let cert = strata_rdma::tls::PemFile {
            what: "etcd_cert_file",
            path: cfg.etcd_cert_file.as_ref(),
        };
        strata_rdma::tls::load_certs(cert).map_err(bad)?;
        let key = strata_rdma::tls::PemFile {
            what: "etcd_key_file",
            path: cfg.etcd_key_file.as_ref(),
        };
        strata_rdma::tls::load_key(key).map_err(bad)?;
    }
    Ok(())
}
