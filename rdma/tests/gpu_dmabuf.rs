//! GPUDirect RDMA through dma-buf: RDMA READ out of and into GPU memory.
//!
//! Needs a GPU, an NVIDIA driver that exports dma-bufs and an RDMA NIC whose
//! driver imports them (mlx5; soft-RoCE cannot), so it is ignored by default;
//! `bench/gpu-rdma-check.sh` runs it on such a machine with
//! `STRATA_GPU_RDMA_DEVICE=<nic>` (e.g. mlx5_0).
#![cfg(feature = "cuda")]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use strata_rdma::verbs::gpu::GpuMemory;
use strata_rdma::verbs::{VerbsConfig, VerbsTransport};
use strata_rdma::Transport;

const LEN: usize = 16 << 20;

fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

async fn transport(dev: &str) -> Arc<VerbsTransport> {
    let cfg = VerbsConfig {
        device_name: Some(dev.to_owned()),
        ..Default::default()
    };
    VerbsTransport::bind(SocketAddr::from(([127, 0, 0, 1], 0)), cfg)
        .await
        .expect("verbs transport on the NIC")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a GPU and a dma-buf capable RDMA NIC: bench/gpu-rdma-check.sh"]
async fn rdma_read_from_and_into_gpu_memory() {
    let dev = std::env::var("STRATA_GPU_RDMA_DEVICE").expect("STRATA_GPU_RDMA_DEVICE=<nic>");
    let ordinal = std::env::var("STRATA_GPU_ORDINAL").map_or(0, |v| v.parse().expect("ordinal"));
    let owner = transport(&dev).await;
    let reader = transport(&dev).await;

    // GPU memory as the source: a peer READs straight out of it.
    let gpu_src = GpuMemory::alloc(ordinal, LEN as u64).expect("GPU memory + dma-buf export");
    let want = pattern(7);
    gpu_src.upload(0, &want).expect("upload");
    let src = owner.register_gpu(gpu_src).expect("ibv_reg_dmabuf_mr");
    let mut host = vec![0u8; LEN];
    // SAFETY: `host` outlives `dst` (dropped before it is read).
    let dst = unsafe { reader.register(host.as_mut_ptr() as u64, LEN as u64, None) }.expect("reg");
    let desc = owner.describe(&src, 0, LEN as u64, None).expect("describe");
    let t = Instant::now();
    reader
        .read(&desc, &dst, 0)
        .await
        .expect("READ from GPU memory");
    let secs = t.elapsed().as_secs_f64();
    drop(dst);
    assert!(host == want, "bytes read from GPU memory differ");
    println!("GPU -> host READ: {:.2} GB/s", LEN as f64 / secs / 1e9);

    // GPU memory as the destination: our READ lands straight in it.
    let gpu_dst = GpuMemory::alloc(ordinal, LEN as u64).expect("GPU memory + dma-buf export");
    let host_src = pattern(42);
    // SAFETY: `host_src` outlives `src2`.
    let src2 = unsafe { owner.register(host_src.as_ptr() as u64, LEN as u64, None) }.expect("reg");
    let dst2 = reader
        .register_gpu(Arc::clone(&gpu_dst))
        .expect("ibv_reg_dmabuf_mr");
    let desc2 = owner
        .describe(&src2, 0, LEN as u64, None)
        .expect("describe");
    let t = Instant::now();
    reader
        .read(&desc2, &dst2, 0)
        .await
        .expect("READ into GPU memory");
    let secs = t.elapsed().as_secs_f64();
    let mut back = vec![0u8; LEN];
    gpu_dst.download(0, &mut back).expect("download");
    assert!(back == host_src, "bytes read into GPU memory differ");
    println!("host -> GPU READ: {:.2} GB/s", LEN as f64 / secs / 1e9);
}
