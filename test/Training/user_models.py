"""Modules written the way users write them in plain PyTorch, for the
training parity tests (make_reference.py builds, exports and trains them).

UserGPT is the GPT-style training module of issue 31, as a new user wrote
it: a token embedding plus a learned position embedding, pre-norm blocks
with one fused Linear(d, 3d) for q, k and v split in three, heads made with
view(B, T, h, -1).transpose(1, 2), a causal mask added to the scores, an
exact-GELU MLP, a final LayerNorm and an untied Linear(d, V, bias=False)
head. Its vocabulary (97) divides by no tensor-parallel degree, so the
planner must keep the head and the embedding whole there.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

USER_GPT = dict(vocab=97, dim=64, heads=4, layers=2, seq=16)


class Block(nn.Module):
    def __init__(self, d, h, t):
        super().__init__()
        self.h = h
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)
        mask = torch.triu(torch.full((t, t), float("-inf")), diagonal=1)
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.h, -1).transpose(1, 2)
        k = k.view(B, T, self.h, -1).transpose(1, 2)
        v = v.view(B, T, self.h, -1).transpose(1, 2)
        att = q @ k.transpose(-2, -1) / math.sqrt(C // self.h)
        att = att + self.mask[:T, :T]
        y = F.softmax(att, dim=-1) @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        x = x + self.proj(y)
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class UserGPT(nn.Module):
    def __init__(self, vocab, dim, heads, layers, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, seq)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        T = idx.shape[1]
        pos = torch.arange(T, device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln_f(x))


def build_user_gpt():
    torch.manual_seed(31)
    return UserGPT(**USER_GPT)
