//! TLS settings of a node, as redis-server names them: `tls_port` speaks
//! TLS with `tls_cert_file`/`tls_key_file`, asks clients for certificates
//! signed by `tls_ca_cert_file` per `tls_auth_clients`, and with
//! `tls_cluster` calls its peers over TLS and advertises its TLS port;
//! `tls_data_plane` puts the TCP data plane in TLS with the same files.
//!
//! Loading and the stream itself are `strata_rdma::tls`; this module only
//! maps the keys onto it and checks them once, at load, so that a bad file
//! stops the node with a message naming the key.

use std::sync::Arc;

use strata_rdma::tcp::{TcpTls, TlsListen};
use strata_rdma::tls::{ClientAuth, ClientFiles, PemFile, ServerFiles, TlsError};

use crate::config::Config;

/// Fills the defaults that depend on other keys and records what does not
/// fit together. `cluster_set`, `data_plane_set`: `tls_cluster`,
/// `tls_data_plane` were given.
pub fn resolve(
    cfg: &mut Config,
    cluster_set: bool,
    data_plane_set: bool,
    errors: &mut Vec<String>,
) {
    resolve_port(cfg, cluster_set, errors);
    resolve_data_plane(cfg, data_plane_set, errors);
}

/// `tls_data_plane` follows `tls_cluster` unless given: a cluster whose
/// calls are encrypted keeps its payloads so too. RDMA has no TLS.
fn resolve_data_plane(cfg: &mut Config, data_plane_set: bool, errors: &mut Vec<String>) {
    let rdma = cfg.protocol == "rdma";
    if !data_plane_set {
        cfg.tls_data_plane = cfg.tls_cluster && !rdma;
    }
    if !cfg.tls_data_plane {
        return;
    }
    if rdma {
        errors.push("tls_data_plane: yes needs protocol tcp (RDMA READ has no TLS)".into());
    }
    if cfg.tls_cert_file.is_empty() || cfg.tls_key_file.is_empty() {
        errors.push("tls_data_plane: needs tls_cert_file and tls_key_file".into());
    }
    if cfg.tls_ca_cert_file.is_empty() {
        errors.push(
            "tls_data_plane: needs tls_ca_cert_file (to check the clients and peers it pulls from)"
                .into(),
        );
    }
}

fn resolve_port(cfg: &mut Config, cluster_set: bool, errors: &mut Vec<String>) {
    if cfg.tls_auth_clients.is_empty() {
        let with_ca = !cfg.tls_ca_cert_file.is_empty();
        cfg.tls_auth_clients = if with_ca { "yes" } else { "no" }.into();
    }
    if cfg.port == 0 && cfg.tls_port == 0 {
        errors.push("port: 0 turns the plaintext port off, which needs tls_port".into());
        return;
    }
    if cfg.port == 0 && !cluster_set {
        cfg.tls_cluster = true;
    }
    if cfg.port == 0 && !cfg.tls_cluster {
        errors.push(
            "tls_cluster: no, but port is 0: peers and redirected clients would have no port to call".into(),
        );
    }
    if cfg.tls_port != 0 && cfg.tls_port == cfg.port {
        errors.push(format!("tls_port: {} is the same as port", cfg.tls_port));
    }
    if cfg.tls_cluster && cfg.tls_port == 0 {
        errors.push("tls_cluster: needs tls_port (the port peers call)".into());
    }
    let serving = cfg.tls_port != 0;
    if serving && (cfg.tls_cert_file.is_empty() || cfg.tls_key_file.is_empty()) {
        errors.push("tls_port: needs tls_cert_file and tls_key_file".into());
    }
    if cfg.tls_cluster && cfg.tls_ca_cert_file.is_empty() {
        errors.push(
            "tls_cluster: needs tls_ca_cert_file (the CA that signs the nodes' certificates)"
                .into(),
        );
    }
    if cfg.tls_auth_clients != "no" && cfg.tls_ca_cert_file.is_empty() {
        errors.push(format!(
            "tls_auth_clients: {} needs tls_ca_cert_file to check client certificates",
            cfg.tls_auth_clients
        ));
    }
}

/// Loads every file once, so that a missing, unreadable or mismatched one
/// is a start-up error naming its key.
pub fn check_files(cfg: &Config) -> Result<(), String> {
    let fail = |e: TlsError| format!("invalid configuration:\n  {e}");
    server_config(cfg).map_err(fail)?;
    peer_config(cfg).map_err(fail)?;
    data_plane(cfg).map_err(fail)?;
    Ok(())
}

fn pem<'a>(what: &'static str, path: &'a str) -> PemFile<'a> {
    PemFile {
        what,
        path: path.as_ref(),
    }
}

/// The TLS port's configuration; `None` without one.
pub fn server_config(cfg: &Config) -> Result<Option<Arc<rustls::ServerConfig>>, TlsError> {
    if cfg.tls_port == 0 {
        return Ok(None);
    }
    serving(cfg).map(Some)
}

/// Serving TLS with `tls_cert_file`, clients asked per `tls_auth_clients`.
fn serving(cfg: &Config) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let auth = match cfg.tls_auth_clients.as_str() {
        "yes" => ClientAuth::Required,
        "optional" => ClientAuth::Optional,
        _ => ClientAuth::Off,
    };
    let files = ServerFiles {
        cert: pem("tls_cert_file", &cfg.tls_cert_file),
        key: pem("tls_key_file", &cfg.tls_key_file),
        ca: (!cfg.tls_ca_cert_file.is_empty())
            .then(|| pem("tls_ca_cert_file", &cfg.tls_ca_cert_file)),
        auth,
    };
    strata_rdma::tls::server_config(files)
}

/// How this node dials its peers in a TLS cluster: it checks them against
/// `tls_ca_cert_file` and presents its own certificate (Redis does the
/// same without `tls-client-cert-file`). `None` outside one.
pub fn peer_config(cfg: &Config) -> Result<Option<Arc<rustls::ClientConfig>>, TlsError> {
    if !cfg.tls_cluster {
        return Ok(None);
    }
    let files = ClientFiles {
        ca: pem("tls_ca_cert_file", &cfg.tls_ca_cert_file),
        identity: Some((
            pem("tls_cert_file", &cfg.tls_cert_file),
            pem("tls_key_file", &cfg.tls_key_file),
        )),
    };
    strata_rdma::tls::client_config(files).map(Some)
}

/// Whether this node can read `tls` descriptors: it has a CA to check
/// their owners with and a certificate to show them.
pub fn dials_data_plane(cfg: &Config) -> bool {
    !cfg.tls_ca_cert_file.is_empty()
        && !cfg.tls_cert_file.is_empty()
        && !cfg.tls_key_file.is_empty()
}

/// TLS of the data plane: the listener speaks it with `tls_data_plane`
/// (clients asked for certificates as on the TLS port); `tls` descriptors
/// (a TLS client's PUT payloads, a TLS peer's copies) are read with the
/// CA and this node's certificate wherever this node has both, even when
/// its own listener is plaintext.
pub fn data_plane(cfg: &Config) -> Result<TcpTls, TlsError> {
    let listen = if cfg.tls_data_plane {
        TlsListen::Tls(serving(cfg)?)
    } else {
        TlsListen::Plain
    };
    let dial = if dials_data_plane(cfg) {
        let files = ClientFiles {
            ca: pem("tls_ca_cert_file", &cfg.tls_ca_cert_file),
            identity: Some((
                pem("tls_cert_file", &cfg.tls_cert_file),
                pem("tls_key_file", &cfg.tls_key_file),
            )),
        };
        Some(strata_rdma::tls::client_config(files)?)
    } else {
        None
    };
    Ok(TcpTls {
        listen,
        dial,
        server_name: None,
    })
}
