"""The ivf bf16 search of one list against the float32 product, on generated rows (issue 43).

    python benchmarks/graph/rerank_micro.py

One (queries, members) block of a list at 1 thread: ``fp32`` is the float32 product and its
top ``kk``; ``bf16+rerank`` is one bf16 product, its top ``wide`` per row, and the float32
similarities of those (gathered 32 rows at a time into a reused buffer, as
``datamask._ivf_lists.ListBlocks._reranked`` does). Rows: 8 dense clusters (a row's 1st and
80th neighbours ~0.016 apart, as in the groups of a 10M generated run). Prints the best of 3
timings of each and how many of the float32 top ``kk`` the bf16 search kept.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

D = 384
CASES = [
    (5000, 3000, 1, 8),
    (5000, 3000, 1, 33),
    (27000, 600, 80, 160),
    (90000, 180, 80, 160),
    (27000, 600, 1, 8),
]


def data(gen: torch.Generator, m: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``r`` query rows and ``m`` member rows drawn around 8 shared centres."""
    c = torch.nn.functional.normalize(torch.randn(8, D, generator=gen), dim=1)

    def draw(n: int) -> torch.Tensor:
        x = c[torch.randint(0, 8, (n,), generator=gen)] * 0.9
        return torch.nn.functional.normalize(
            x + 0.45 * torch.randn(n, D, generator=gen) / 19.6, dim=1
        )

    return draw(r), draw(m)


def reranked(q: torch.Tensor, base: torch.Tensor, kk: int, wide: int) -> tuple[torch.Tensor, ...]:
    """Top ``wide`` by one bf16 product, then the float32 top ``kk`` of those."""
    cand = (q.bfloat16() @ base.bfloat16().T).topk(wide, dim=1, sorted=False).indices
    buf, sims, top = (
        torch.empty(32 * wide * D),
        torch.empty(len(q), kk),
        torch.empty(len(q), kk, dtype=torch.long),
    )
    for lo in range(0, len(q), 32):
        part = cand[lo : lo + 32]
        near = buf[: part.numel() * D].view(len(part), wide, D)
        torch.index_select(base, 0, part.reshape(-1), out=near.view(-1, D))
        s, i = torch.bmm(near, q[lo : lo + 32, :, None])[:, :, 0].topk(kk, dim=1)
        sims[lo : lo + 32], top[lo : lo + 32] = s, part.gather(1, i)
    return sims, top


def best_of_3(fn) -> tuple[float, tuple[torch.Tensor, ...]]:
    best, out = math.inf, None
    for _ in range(3):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3, out


def case(gen: torch.Generator, m: int, r: int, kk: int, wide: int) -> str:
    q, base = data(gen, m, r)
    t_fp32, exact = best_of_3(lambda: (q @ base.T).topk(kk, dim=1))
    t_bf16, approx = best_of_3(lambda: reranked(q, base, kk, wide))
    kept = sum(
        len(set(a.tolist()) & set(b.tolist())) for a, b in zip(exact[1], approx[1], strict=True)
    )
    loss = float((exact[0][:, 0] - approx[0][:, 0]).max())
    return (
        f"members {m:,} rows {r:,} kk {kk} candidates {wide}: fp32 {t_fp32:.1f} ms, "
        f"bf16+rerank {t_bf16:.1f} ms ({t_bf16 / t_fp32:.2f}), fp32 top kk kept "
        f"{kept / (r * kk):.5f}, best at most {loss:.1e} lower"
    )


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    for m, r, kk, wide in CASES:
        print(case(generator, m, r, kk, wide))
