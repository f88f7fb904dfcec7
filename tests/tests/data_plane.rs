//! Choosing the data plane at start: `protocol: rdma` on a machine (or a
//! build) without RDMA fails at once with a message that says why, unless
//! `rdma_fallback_tcp` allows TCP, which then serves with one warning.

use strata_tests::{free_port, run_to_exit, server_command, Server};

#[test]
fn rdma_without_a_device_fails_at_start_with_the_reason() {
    let port = free_port().to_string();
    let exit = run_to_exit({
        let mut cmd = server_command();
        cmd.args(["--bind", "127.0.0.1", "--port", &port]).args([
            "--metrics-port",
            "0",
            "--data-port",
            "0",
            "--protocol",
            "rdma",
        ]);
        cmd
    });
    assert!(!exit.status.success(), "started without an RDMA device");
    // A default build says it has no RDMA; an `rdma` build on a machine
    // without devices says what ibv_get_device_list found.
    assert!(
        exit.stderr.contains("built without RDMA support")
            || exit.stderr.contains("no RDMA device"),
        "unclear failure:\n{}",
        exit.stderr
    );
}

#[test]
fn rdma_fallback_serves_over_tcp_with_one_warning() {
    let server = Server::start(&["--protocol", "rdma", "--rdma-fallback-tcp", "true"]);
    let reply = server.send_raw(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$17\r\nrdma_fallback_tcp\r\n");
    assert!(
        String::from_utf8_lossy(&reply).contains("true"),
        "CONFIG GET: {}",
        String::from_utf8_lossy(&reply)
    );
    let log = server.stderr();
    assert_eq!(
        log.matches("falling back to the TCP data plane").count(),
        1,
        "expected one fallback warning:\n{log}"
    );
}
