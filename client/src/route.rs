//! Where this client's data plane listens and what it advertises when the
//! config leaves them unset: the environment's `STRATA_DATA_BIND` /
//! `STRATA_DATA_ADVERTISE`, else the local address of the route towards
//! the first seed that has one. Nodes pull PUT payloads from that address,
//! so it must be one they can reach: loopback works only when the nodes
//! are on this host, and a seed on loopback is exactly that case (the route
//! to 127.0.0.1 leaves from 127.0.0.1).
//!
//! Finding the route sends nothing: connecting a UDP socket only asks the
//! kernel's routing table which source address it would use.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};
use std::time::Duration;

use crate::{ClientConfig, Error, Result};

/// Overrides the data plane's bind address (`ip:port`) where the config
/// leaves `data_bind` unset.
pub const DATA_BIND_ENV: &str = "STRATA_DATA_BIND";

/// Overrides the host put in this client's descriptors where the config
/// leaves `data_advertise` unset.
pub const DATA_ADVERTISE_ENV: &str = "STRATA_DATA_ADVERTISE";

/// Seeds tried for a route: a longer list is a cluster's worth of nodes,
/// and the first few that resolve tell the same story.
const ROUTE_SEEDS_MAX: usize = 16;

/// The data plane's bind address and advertised host, from the config, the
/// environment and the route towards the seeds, in that order.
pub(crate) async fn data_plane_addr(cfg: &ClientConfig) -> Result<(SocketAddr, Option<String>)> {
    let env = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    let env_bind = env(DATA_BIND_ENV);
    let env_advertise = env(DATA_ADVERTISE_ENV);
    // Only look for a route when something will use it.
    let bind_known = cfg.data_bind.is_some() || env_bind.is_some();
    let advertise_known = cfg.data_advertise.is_some() || env_advertise.is_some();
    let route = if bind_known && advertise_known {
        None
    } else {
        route_source(&cfg.seeds, cfg.timeout).await
    };
    choose(
        cfg.data_bind,
        cfg.data_advertise.clone(),
        env_bind,
        env_advertise,
        route,
    )
    .map_err(|e| Error::Io(std::io::Error::new(std::io::ErrorKind::InvalidInput, e)))
}

/// The pure half of [`data_plane_addr`]: a set value wins over the
/// environment, which wins over the route; an unspecified bind address
/// (`0.0.0.0:0`) advertises the route's address, since a descriptor naming
/// `0.0.0.0` would send the node to itself.
fn choose(
    bind: Option<SocketAddr>,
    advertise: Option<String>,
    env_bind: Option<String>,
    env_advertise: Option<String>,
    route: Option<IpAddr>,
) -> std::result::Result<(SocketAddr, Option<String>), String> {
    let bind = match (bind, env_bind) {
        (Some(addr), _) => addr,
        (None, Some(text)) => text
            .trim()
            .parse()
            .map_err(|_| format!("{DATA_BIND_ENV}={text:?} is not an ip:port"))?,
        (None, None) => SocketAddr::new(route.unwrap_or(Ipv4Addr::LOCALHOST.into()), 0),
    };
    let advertise = advertise.or(env_advertise).or_else(|| {
        bind.ip()
            .is_unspecified()
            .then_some(route)
            .flatten()
            .map(|ip| ip.to_string())
    });
    Ok((bind, advertise))
}

/// The local address of the route towards the first seed that resolves
/// and has a route; `None` when none does (the connect that follows then
/// reports the unreachable seeds).
pub(crate) async fn route_source(seeds: &[String], timeout: Duration) -> Option<IpAddr> {
    for seed in seeds.iter().take(ROUTE_SEEDS_MAX) {
        let Ok(Ok(addrs)) = tokio::time::timeout(timeout, tokio::net::lookup_host(seed)).await
        else {
            continue;
        };
        if let Some(ip) = addrs.into_iter().find_map(|a| source_towards(a).ok()) {
            return Some(ip);
        }
    }
    None
}

/// The source address the kernel would pick for traffic to `peer`.
fn source_towards(peer: SocketAddr) -> std::io::Result<IpAddr> {
    let any: IpAddr = match peer {
        SocketAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        SocketAddr::V6(_) => std::net::Ipv6Addr::UNSPECIFIED.into(),
    };
    let socket = UdpSocket::bind((any, 0))?;
    socket.connect(peer)?;
    Ok(socket.local_addr()?.ip())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    const T: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_loopback_seed_keeps_the_data_plane_on_loopback() {
        let ip = route_source(&seeds(&["127.0.0.1:7379"]), T).await;
        assert_eq!(ip, Some(IpAddr::from(Ipv4Addr::LOCALHOST)));
        let ip = route_source(&seeds(&["localhost:7379"]), T).await;
        assert!(ip.is_some_and(|ip| ip.is_loopback()), "{ip:?}");
    }

    #[tokio::test]
    async fn seeds_that_do_not_resolve_are_skipped() {
        let ip = route_source(&seeds(&["no port here", "127.0.0.1:7379"]), T).await;
        assert_eq!(ip, Some(IpAddr::from(Ipv4Addr::LOCALHOST)));
        assert_eq!(route_source(&seeds(&["no port here"]), T).await, None);
        assert_eq!(route_source(&[], T).await, None);
    }

    #[test]
    fn the_source_of_a_route_is_an_address_of_this_host() {
        // Whatever the route to a documentation address is here (none, or
        // a default route), its source must be bindable: it is what the
        // data plane listens on.
        let peer: SocketAddr = "192.0.2.77:7379".parse().unwrap();
        if let Ok(ip) = source_towards(peer) {
            assert!(UdpSocket::bind((ip, 0)).is_ok(), "{ip} is not local");
        }
    }

    #[test]
    fn the_route_is_the_default_and_settings_win_over_it() {
        let route: Option<IpAddr> = Some("10.213.7.21".parse().unwrap());
        let set: SocketAddr = "10.0.0.5:4000".parse().unwrap();
        let r = choose(None, None, None, None, route).unwrap();
        assert_eq!(r, ("10.213.7.21:0".parse().unwrap(), None));
        let r = choose(None, None, None, None, None).unwrap();
        assert_eq!(r, ("127.0.0.1:0".parse().unwrap(), None));
        let r = choose(Some(set), None, Some("10.0.0.9:0".into()), None, route).unwrap();
        assert_eq!(r, (set, None));
        let r = choose(
            None,
            None,
            Some(" 10.0.0.9:1 ".into()),
            Some("h".into()),
            route,
        )
        .unwrap();
        assert_eq!(r, ("10.0.0.9:1".parse().unwrap(), Some("h".into())));
        let e = choose(None, None, Some("10.0.0.9".into()), None, route).unwrap_err();
        assert!(e.contains(DATA_BIND_ENV) && e.contains("ip:port"), "{e}");
    }

    #[test]
    fn an_unspecified_bind_advertises_the_route() {
        let route: Option<IpAddr> = Some("10.213.7.21".parse().unwrap());
        let any: SocketAddr = "0.0.0.0:0".parse().unwrap();
        let r = choose(Some(any), None, None, None, route).unwrap();
        assert_eq!(r.1.as_deref(), Some("10.213.7.21"));
        let r = choose(Some(any), Some("node-a".into()), None, None, route).unwrap();
        assert_eq!(r.1.as_deref(), Some("node-a"));
        let r = choose(
            None,
            None,
            Some("0.0.0.0:0".into()),
            Some("b".into()),
            route,
        )
        .unwrap();
        assert_eq!(r.1.as_deref(), Some("b"));
        let r = choose(Some(any), None, None, None, None).unwrap();
        assert_eq!(r.1, None);
    }
}
