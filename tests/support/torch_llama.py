"""The LLaMA of libllmt's benchmarks written in PyTorch, for the side-by-side
scripts (tests/bench/torch_cpu_side_by_side.py on the CPU,
tests/gpu/torch_side_by_side.py on a GPU): the same architecture as the
library (RMSNorm, RoPE with rotate-half pairing, grouped-query attention by
scaled_dot_product_attention, SwiGLU, untied head, mean cross-entropy) and
the benchmarks' tokens. cfg holds vocab, d, layers, heads, kv_heads, ffn,
batch, seq, eps and theta. PyTorch is passed in, never imported here, so the
scripts can run (and report) without it."""


def batch(torch, cfg, device="cpu"):
    """The benchmarks' tokens and targets: (i * 2654435761) mod 2^32 mod vocab."""
    n = cfg["batch"] * cfg["seq"]
    i = torch.arange(n, dtype=torch.int64)
    tok = ((i * 2654435761) & 0xFFFFFFFF) % cfg["vocab"]
    tgt = (((i + 1) * 2654435761) & 0xFFFFFFFF) % cfg["vocab"]
    shape = (cfg["batch"], cfg["seq"])
    return tok.view(shape).to(device), tgt.view(shape).to(device)


def build_model(torch, cfg):
    """The model, on the CPU, with PyTorch's default initialisation."""
    nn, F = torch.nn, torch.nn.functional
    d, hd = cfg["d"], cfg["d"] // cfg["heads"]
    gqa = cfg["kv_heads"] != cfg["heads"]

    class RMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x):
            xf = x.float()
            y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + cfg["eps"])
            return (y * self.weight).to(x.dtype)

    def rope(x, cos, sin):  # x [b, h, t, hd]; cos, sin [t, hd / 2]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            kv = cfg["kv_heads"] * hd
            self.attn_norm, self.ffn_norm = RMSNorm(), RMSNorm()
            self.q = nn.Linear(d, d, bias=False)
            self.k = nn.Linear(d, kv, bias=False)
            self.v = nn.Linear(d, kv, bias=False)
            self.o = nn.Linear(d, d, bias=False)
            self.gate = nn.Linear(d, cfg["ffn"], bias=False)
            self.up = nn.Linear(d, cfg["ffn"], bias=False)
            self.down = nn.Linear(cfg["ffn"], d, bias=False)

        def forward(self, x, cos, sin):
            b, t, _ = x.shape
            h = self.attn_norm(x)
            q = self.q(h).view(b, t, cfg["heads"], hd).transpose(1, 2)
            k = self.k(h).view(b, t, cfg["kv_heads"], hd).transpose(1, 2)
            v = self.v(h).view(b, t, cfg["kv_heads"], hd).transpose(1, 2)
            q, k = rope(q, cos, sin), rope(k, cos, sin)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
            h = self.ffn_norm(x)
            return x + self.down(F.silu(self.gate(h)) * self.up(h))

    class LLaMA(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(cfg["vocab"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.norm = RMSNorm()
            self.head = nn.Linear(d, cfg["vocab"], bias=False)
            inv = 1.0 / cfg["theta"] ** (torch.arange(0, hd, 2).float() / hd)
            ang = torch.outer(torch.arange(cfg["seq"]).float(), inv)
            self.register_buffer("cos", ang.cos(), persistent=False)  # [T, hd / 2]
            self.register_buffer("sin", ang.sin(), persistent=False)

        def forward(self, tokens, targets):
            x = self.embed(tokens)
            for blk in self.blocks:
                x = blk(x, self.cos, self.sin)
            logits = self.head(self.norm(x))
            return F.cross_entropy(logits.float().view(-1, cfg["vocab"]), targets.view(-1))

    return LLaMA()
