//! `kv_events_endpoint` and `kv_events_replay_endpoint` as vLLM reads its
//! `endpoint` and `replay_endpoint`: `tcp://host:port`, where a wildcard
//! host (`*`, `0.0.0.0`, `::`) means bind on every interface and any other
//! host means connect to it (a router that binds one SUB socket for a
//! whole fleet, as llm-d's does). The replay endpoint is always bound.
//! Pure: checked at config load, used at start.

/// Where the PUB socket goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Bind this `tcp://ip:port` (port 0: any free port).
    Bind(String),
    /// Connect to this `tcp://host:port`.
    Connect(String),
}

/// Parses `kv_events_endpoint`.
pub fn parse(text: &str) -> Result<Target, String> {
    let (host, port) = split(text)?;
    match wildcard(host) {
        Some(any) => Ok(Target::Bind(format!("tcp://{any}:{port}"))),
        None if port == 0 => Err(format!(
            "{text:?}: port 0 needs a wildcard host to bind (tcp://*:0); a node connects to a named host on a real port"
        )),
        None => Ok(Target::Connect(format!("tcp://{host}:{port}"))),
    }
}

/// Parses `kv_events_replay_endpoint`: always bound, on the named address
/// or, for a wildcard, every interface.
pub fn parse_bind(text: &str) -> Result<String, String> {
    let (host, port) = split(text)?;
    Ok(format!("tcp://{}:{port}", wildcard(host).unwrap_or(host)))
}

fn split(text: &str) -> Result<(&str, u16), String> {
    let Some(rest) = text.strip_prefix("tcp://") else {
        return Err(format!(
            "{text:?} is not a ZMQ TCP endpoint (use tcp://host:port, e.g. tcp://*:5557)"
        ));
    };
    let bad = || format!("{text:?}: expected tcp://host:port with a port 0..=65535");
    let (host, port) = rest.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ok = !bare.is_empty()
        && bare
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-.:*".contains(c));
    if !ok {
        return Err(bad());
    }
    Ok((host, port))
}

/// The bind address a wildcard host stands for.
fn wildcard(host: &str) -> Option<&'static str> {
    match host {
        "*" | "0.0.0.0" => Some("0.0.0.0"),
        "::" | "[::]" => Some("[::]"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_bind_and_hosts_connect() {
        let bind = |s: &str| Target::Bind(s.to_string());
        assert_eq!(parse("tcp://*:5557"), Ok(bind("tcp://0.0.0.0:5557")));
        assert_eq!(parse("tcp://0.0.0.0:0"), Ok(bind("tcp://0.0.0.0:0")));
        assert_eq!(parse("tcp://[::]:5557"), Ok(bind("tcp://[::]:5557")));
        assert_eq!(
            parse("tcp://router.svc:5557"),
            Ok(Target::Connect("tcp://router.svc:5557".into()))
        );
        assert_eq!(
            parse_bind("tcp://127.0.0.1:5558"),
            Ok("tcp://127.0.0.1:5558".into())
        );
        assert_eq!(parse_bind("tcp://*:5558"), Ok("tcp://0.0.0.0:5558".into()));
        for bad in [
            "",
            "5557",
            "udp://*:5557",
            "ipc:///tmp/x",
            "tcp://*",
            "tcp://*:70000",
            "tcp://:5557",
            "tcp://a b:5557",
            "tcp://host:0",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
