"""CUDA tensors through the Python SDK (staged through pinned host memory),
against a running node: every value read back into another CUDA tensor and
compared on the GPU, and GB/s next to ``tensor.cpu()`` + a host
``batch_put_from`` (and host ``batch_get_into`` + ``.cuda()``). Run by
bench/gpu-check.sh step 4; needs torch with CUDA and the strata wheel.

    python gpu_staging.py 127.0.0.1:7579
"""

from __future__ import annotations

import sys
import time

import torch

import strata

MIB = 1 << 20


def timed(fn):
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t


def main(addr: str) -> int:
    c = strata.Client(addr)
    failed = 0
    for size, n in ((1 * MIB, 64), (16 * MIB, 8)):
        total = size * n / 1e9
        src = [torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda") for _ in range(n)]
        keys = [f"gpu-staging:{size}:{i}" for i in range(n)]
        res, put_s = timed(lambda: c.batch_put_from(keys, src))
        assert res == [None] * n, res
        dst = [torch.empty_like(s) for s in src]
        got, get_s = timed(lambda: c.batch_get_into(keys, dst))
        ok = got == [size] * n and all(torch.equal(a, b) for a, b in zip(src, dst))
        failed += not ok
        # The baseline: the engine copies to the CPU itself.
        hkeys = [k + ":host" for k in keys]
        res, base_put_s = timed(lambda: c.batch_put_from(hkeys, [s.cpu() for s in src]))
        assert res == [None] * n, res
        host = [torch.empty(size, dtype=torch.uint8).pin_memory() for _ in range(n)]

        def host_get():
            r = c.batch_get_into(hkeys, host)
            return r, [h.cuda(non_blocking=True) for h in host]
        (_, back), base_get_s = timed(host_get)
        ok2 = all(torch.equal(a, b) for a, b in zip(src, back))
        failed += not ok2
        print(f"{size // MIB} MiB x {n}: staged put {total / put_s:.2f} GB/s "
              f"(tensor.cpu()+put {total / base_put_s:.2f}, {base_put_s / put_s:.2f}x), "
              f"staged get {total / get_s:.2f} GB/s (get+.cuda() {total / base_get_s:.2f}, "
              f"{base_get_s / get_s:.2f}x), bytes {'identical' if ok and ok2 else 'DIFFER'}")
        st = c._stager
        print(f"  stager: {st.groups} groups, {st.overlapped} overlapped")
    # One value, the single-key calls.
    one = torch.arange(4 * MIB, dtype=torch.int32, device="cuda") % 251
    c.put_from("gpu-staging:one", one)
    back = torch.zeros_like(one)
    assert c.get_into("gpu-staging:one", back) == one.numel() * 4
    failed += not torch.equal(one, back)
    c.close()
    print("gpu staging: " + ("OK" if not failed else f"FAILED ({failed})"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
