//! A router's end of KV events, for `bench/kv-events.sh`: binds a SUB
//! socket that nodes connect to (`kv_events_endpoint tcp://this-host:port`)
//! and counts what arrives; prints the batches and bytes received once
//! nothing has arrived for `idle_s` seconds.
//!
//!     cargo run --release -p strata-server --example kv_events_drain -- tcp://127.0.0.1:5557 [idle_s]

use std::time::Duration;

use zeromq::{Socket, SocketRecv, SubSocket};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let endpoint = args
        .next()
        .ok_or_else(|| anyhow::anyhow!("usage: kv_events_drain tcp://host:port [idle_s]"))?;
    let idle = Duration::from_secs_f64(args.next().map_or(Ok(5.0), |s| s.parse())?);
    let mut sub = SubSocket::new();
    sub.bind(&endpoint).await?;
    sub.subscribe("").await?;
    println!("listening on {endpoint}");
    let (mut batches, mut bytes) = (0u64, 0u64);
    // Until the first batch, wait as long as it takes (the load starts
    // after this process); then stop once the stream has been idle.
    loop {
        let got = if batches == 0 {
            Ok(sub.recv().await)
        } else {
            tokio::time::timeout(idle, sub.recv()).await
        };
        match got {
            Ok(Ok(msg)) => {
                batches += 1;
                bytes += msg.iter().map(|f| f.len() as u64).sum::<u64>();
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => break,
        }
    }
    println!("received {batches} batches, {bytes} bytes");
    Ok(())
}
