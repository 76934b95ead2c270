"""tilejit's attention in a PyTorch model, in place of F.scaled_dot_product_attention.

    cmake -S . -B build -G Ninja && cmake --build build
    pip install --no-build-isolation ./python
    python examples/python/sdpa_drop_in.py

Q, K and V come out of the projection as [B, S, H, D] and reach the kernel as [B, H, S, D] views
(no copy); grouped-query heads (8 query heads per kv head here) and torch.compile work as with
SDPA. fp8=True quantizes Q, K and V to e4m3 on the way.
"""
import torch
import torch.nn.functional as F

import tilejit


class Attention(torch.nn.Module):
    def __init__(self, dim=2048, heads=16, kv_heads=2, sdpa=F.scaled_dot_product_attention):
        super().__init__()
        self.h, self.hkv, self.d, self.sdpa = heads, kv_heads, dim // heads, sdpa
        self.q = torch.nn.Linear(dim, dim, bias=False)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.d, bias=False)
        self.o = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, S, _ = x.shape
        q = self.q(x).view(B, S, self.h, self.d).transpose(1, 2)
        k, v = self.kv(x).view(B, S, 2, self.hkv, self.d).unbind(2)
        o = self.sdpa(q, k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
        return self.o(o.transpose(1, 2).reshape(B, S, -1))


def main():
    torch.manual_seed(0)
    model = Attention().cuda().to(torch.bfloat16).eval()
    x = torch.randn(4, 2048, 2048, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        ref = model(x)
        model.sdpa = tilejit.scaled_dot_product_attention
        got = torch.compile(model, fullgraph=True)(x)
    err = ((got.float() - ref.float()).norm() / ref.float().norm()).item()
    print(f"tilejit vs SDPA through the model (torch.compile, fullgraph): rel RMSE {err:.2e}")


if __name__ == "__main__":
    main()
