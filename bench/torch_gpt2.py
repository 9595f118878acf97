#!/usr/bin/env python3
"""The PyTorch anchor for bench/train_gpu: GPT-2 124M trained by PyTorch on the same GPU.

    python3 bench/torch_gpt2.py [--batches 16,32,64] [--seq 1024] [--steps 10] [--no-compile]

The model of llm.c's train_gpt2.py, nanoGPT's with GELU's tanh form as GPT-2 had it and as
gpurun-train computes it (pre-LayerNorm blocks, F.scaled_dot_product_attention with
is_causal, tied embeddings, the vocabulary padded to 50304), bf16 autocast over fp32 weights,
fused AdamW, and torch.compile: what a PyTorch user would train this model with. Random tokens; each batch
size is compiled, warmed up for 3 steps, then timed over --steps steps with CUDA events.

Prints the same table as train_gpu, with the same FLOP count (6 x (12 L C^2 + Vp C) x T +
6 L C T (T + 1) per sequence) and the same peak (989 TFLOP/s, H100 SXM dense bf16), so the
two tables compare row by row. A batch that does not fit prints "out of memory".
"""
import argparse
import math
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError as e:
    print("SKIP no torch for %s: %s" % (sys.executable, e))
    sys.exit(0)

PEAK_FLOPS = 989e12
L, H, C, V, VP = 12, 12, 768, 50257, 50304


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (z.view(b, t, H, C // H).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(b, t, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, seq):
        super().__init__()
        self.wte = nn.Embedding(VP, C)
        self.wpe = nn.Embedding(seq, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        self.lm_head = nn.Linear(C, VP, bias=False)
        self.lm_head.weight = self.wte.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, VP).float(), targets.view(-1))


def flops_per_sequence(t):
    return 6.0 * (12 * L * C * C + VP * C) * t + 6.0 * L * C * t * (t + 1)


def run(batch, seq, steps, compile_model):
    torch.manual_seed(1337)
    model = GPT(seq).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95),
                            weight_decay=0.1, fused=True)
    fwd = torch.compile(model) if compile_model else model
    x = torch.randint(0, V, (batch, seq), device="cuda")
    y = torch.randint(0, V, (batch, seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = fwd(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    torch.cuda.reset_peak_memory_stats()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        loss = step()
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    flops = flops_per_sequence(seq) * batch
    print("| %d | %d | %.2f | %.0f | %.1f | %.1f%% | %.4f | %.1f GiB | %.0f s |"
          % (batch, seq, ms, batch * seq / ms * 1e3, flops / ms / 1e9,
             100.0 * flops / (ms / 1e3) / PEAK_FLOPS, loss.item(), peak, warm), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="16,32,64")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--no-compile", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("SKIP no CUDA device available")
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    print("PyTorch %s on %s, torch.compile %s" % (torch.__version__,
          torch.cuda.get_device_name(), "off" if a.no_compile else "on"))
    print("| batch | seq | ms/step | tokens/s | TFLOP/s | MFU | loss | peak memory | warm-up |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for b in (int(s) for s in a.batches.split(",")):
        try:
            run(b, a.seq, a.steps, not a.no_compile)
        except torch.cuda.OutOfMemoryError:
            print("| %d | %d | out of memory | | | | | | |" % (b, a.seq), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
