"""The attention anchor of bench/train_gpu --attention-only: PyTorch's scaled_dot_product_attention
at the same shape (GPT-2 small's heads at B, T 1024, bf16, causal), each backend forced
(cuDNN's fused flash attention, FlashAttention-2, the memory-efficient kernel), forward and
forward + backward, the median of --steps calls after --warmup, timed with CUDA events on
random inputs; TFLOP/s of the causal half, 2 B H T^2 D forward and 2.5x that backward.

usage: torch_attention.py [--batches 16,64] [--seq 1024] [--heads 12] [--hs 64]
                          [--warmup 3] [--steps 10]
"""
import argparse
import sys

import torch
import torch.nn.functional as F

try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
except ImportError:  # torch before 2.3
    SDPBackend = sdpa_kernel = None


def median_ms(fn, warmup, steps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(steps):
        e0 = torch.cuda.Event(enable_timing=True)
        e1 = torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--hs", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    a = ap.parse_args()
    if sdpa_kernel is None:
        print("SKIP torch_attention: torch %s has no torch.nn.attention.sdpa_kernel"
              % torch.__version__)
        return 0
    if not torch.cuda.is_available():
        print("SKIP torch_attention: no CUDA device for torch")
        return 0
    print("PyTorch %s, cuDNN %s, on %s" % (torch.__version__, torch.backends.cudnn.version(),
                                         torch.cuda.get_device_name(0)))
    print("| attention | batch | seq | heads | hs | fwd ms | fwd TFLOP/s | fwd+bwd ms | "
          "fwd+bwd TFLOP/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    backends = [("torch SDPA cuDNN", SDPBackend.CUDNN_ATTENTION),
                ("torch SDPA FlashAttention-2", SDPBackend.FLASH_ATTENTION),
                ("torch SDPA memory-efficient", SDPBackend.EFFICIENT_ATTENTION)]
    T, H, D = a.seq, a.heads, a.hs
    for B in (int(b) for b in a.batches.split(",")):
        # (B, T, 3, H, D) as the model's qkv, viewed (B, H, T, D) like nanoGPT's.
        qkv = torch.randn(B, T, 3, H, D, device="cuda", dtype=torch.bfloat16)
        q, k, v = (qkv[:, :, i].transpose(1, 2).detach().requires_grad_() for i in range(3))
        dout = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
        flop = 2.0 * B * H * T * T * D
        for name, be in backends:
            try:
                with sdpa_kernel(be):
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)

                    def fwdbwd():
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                        torch.autograd.grad(o, (q, k, v), dout)

                    f = median_ms(fwd, a.warmup, a.steps)
                    fb = median_ms(fwdbwd, a.warmup, a.steps)
            except RuntimeError as e:
                print("| %s | %d | %d | %d | %d | unavailable: %s |||||"
                      % (name, B, T, H, D, str(e).splitlines()[0][:120]))
                continue
            print("| %s | %d | %d | %d | %d | %.3f | %.0f | %.3f | %.0f |"
                  % (name, B, T, H, D, f, flop / f / 1e9, fb, 3.5 * flop / fb / 1e9))
        del qkv, q, k, v, dout
    return 0


if __name__ == "__main__":
    sys.exit(main())
