"""W3 in PyTorch: one char-level GPT training step (forward, backward, AdamW lr 1e-3) at batch 32, context
64, vocabulary 114, random tokens; the same model as frugal's nn::GPT (token + learned position embeddings,
4 pre-norm blocks of LayerNorm, causal self-attention with 4 heads through one qkv Linear, LayerNorm, MLP 4x
with exact GELU; final LayerNorm, linear head with bias). Median step ms after 5 warm-up steps, one JSON line.

The peer for bench/bench_gpt's BM_GPTStep; bench/compare_gpt.sh runs both alternately. make_gpt(vocab) is the
model for bench/peers/torch_workloads.py's W3 too.
Usage: python3 torch_gpt.py [steps=25] [attention=sdpa|softmax]"""
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

B, T, V, D, L, H = 32, 64, 114, 128, 4, 4
attention = "sdpa"  # or "softmax": the attention form, set by main() or by an importer


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.proj = nn.Linear(D, D)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, H, D // H).permute(2, 0, 3, 1, 4)
        if attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-1, -2)) * (1 / math.sqrt(D // H))
            att = F.softmax(att.masked_fill(self.mask[:t, :t], float("-inf")), dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, D))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.attn, self.ln2 = nn.LayerNorm(D), Attention(), nn.LayerNorm(D)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=V):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, D), nn.Embedding(T, D)
        self.blocks = nn.Sequential(*[Block() for _ in range(L)])
        self.ln_f, self.head = nn.LayerNorm(D), nn.Linear(D, vocab)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.head(self.ln_f(self.blocks(x)))


def make_gpt(vocab=V):
    return GPT(vocab)


def main():
    global attention
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 25
    attention = sys.argv[2] if len(sys.argv) > 2 else "sdpa"
    torch.manual_seed(0)
    model = make_gpt()
    assert sum(p.numel() for p in model.parameters()) == 830834, "not the W3 model"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(tokens).view(-1, V), targets.view(-1))
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(5):
        step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    print(json.dumps({"name": "gpt_train_step", "attention": attention, "peer": "pytorch " + torch.__version__,
                      "threads": torch.get_num_threads(), "median_ms": statistics.median(times) * 1e3,
                      "loss": loss}))


if __name__ == "__main__":
    main()
