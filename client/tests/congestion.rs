//! `tcp_congestion` on a node and a client: every TCP connection either
//! process holds uses the named congestion control, whichever side opened
//! it: the command connection (inline SET and GET), the node's data plane
//! (client reads) and the client's (the node's pulls). Its own test binary,
//! so that no other test's connections share this process, and its tests
//! take turns (`TURN`) for the same reason: each one's node is gone, and
//! with it every connection it held, before the next looks.

mod common;

use common::{round_trip, Node};
use strata_client::{Client, ClientConfig};

/// Reno: built into every kernel and allowed for every user, and not the
/// default of any distribution we know of, so a socket left on the host's
/// default shows.
const CC: &str = "reno";

static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test]
async fn every_connection_of_node_and_client_uses_the_named_control() {
    let _turn = TURN.lock().await;
    let node = Node::start(&["--tcp-congestion", CC]);
    let c = Client::connect_with(ClientConfig {
        cma: false,
        tcp_congestion: Some(CC.into()),
        ..ClientConfig::new(node.addr())
    })
    .await
    .expect("connect");
    every_connection_uses(&node, &c, CC).await;
}

/// The defaults (`auto` on both sides): on a BBR host (as this project's
/// CI machine is), CUBIC or Reno on every connection; elsewhere the host's
/// own default, untouched.
#[tokio::test]
async fn by_default_every_connection_steps_away_from_bbr_only() {
    let _turn = TURN.lock().await;
    let host = strata_rdma::sockopt::host_default();
    let want = strata_rdma::sockopt::resolve(None)
        .expect("auto")
        .unwrap_or_else(|| host.clone());
    assert!(
        !want.starts_with("bbr"),
        "host {host}: the default would leave strata on {want}"
    );
    let node = Node::start(&[]);
    let c = Client::connect_with(ClientConfig {
        cma: false,
        ..ClientConfig::new(node.addr())
    })
    .await
    .expect("connect");
    every_connection_uses(&node, &c, &want).await;
}

/// Moves values inline and pulled, both ways, then checks the control of
/// every established connection of `node` and of this process.
async fn every_connection_uses(node: &Node, c: &Client, cc: &str) {
    // Inline both ways, then pulled both ways (over both inline limits).
    let over = strata_client::DEFAULT_INLINE_GET_MAX.max(strata_client::DEFAULT_INLINE_PUT_MAX);
    round_trip(c, "cc-small", 64 << 10).await;
    round_trip(c, "cc-large", over as usize + 1).await;
    let sockets = established();
    for (who, pid, least) in [("node", node.pid(), 3), ("client", std::process::id(), 3)] {
        let mine: Vec<&(u32, String)> = sockets.iter().filter(|(p, _)| *p == pid).collect();
        assert!(
            mine.len() >= least,
            "{who}: {} established connections, want at least {least}: {sockets:?}",
            mine.len()
        );
        for (_, on) in mine {
            assert_eq!(on, cc, "{who} has a connection on {on}: {sockets:?}");
        }
    }
}

#[tokio::test]
async fn a_control_the_kernel_lacks_is_refused_at_connect() {
    let node = Node::start(&[]);
    let e = Client::connect_with(ClientConfig {
        tcp_congestion: Some("nosuchalgo".into()),
        ..ClientConfig::new(node.addr())
    })
    .await
    .err()
    .expect("connected with a control the kernel lacks");
    assert!(e.to_string().contains("not available"), "{e}");
}

/// (pid, congestion control) of every established TCP connection, from
/// `ss -tinp`: a line naming the socket and its process, then one of
/// details whose first bare word after the option flags is the control.
fn established() -> Vec<(u32, String)> {
    let out = std::process::Command::new("ss")
        .args(["-H", "-t", "-i", "-n", "-p", "state", "established"])
        .output()
        .expect("ss (iproute2)");
    assert!(out.status.success(), "ss failed");
    let text = String::from_utf8_lossy(&out.stdout);
    let mut sockets = Vec::new();
    let mut pid = None;
    for line in text.lines() {
        if !line.starts_with(char::is_whitespace) {
            pid = line
                .split("pid=")
                .nth(1)
                .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
                .and_then(|p| p.parse::<u32>().ok());
            continue;
        }
        let Some(p) = pid.take() else { continue };
        let cc = line
            .split_whitespace()
            .find(|w| !w.contains(':') && !["ts", "sack", "ecn", "ecnseen", "fastopen"].contains(w))
            .unwrap_or("?");
        sockets.push((p, cc.to_owned()));
    }
    sockets
}
