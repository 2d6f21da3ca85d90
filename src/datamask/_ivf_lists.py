"""The inverted lists of the ivf search (:func:`datamask.neighbors.ivf_search`, which
imports this module): rows' lists turned into columns' lists (:func:`column_lists`, also
the reverse K-NN graph of facility location and the near-duplicate search's cells), and the
(queries, list members) products, with the bf16 screen where the CPU has AVX512-BF16 and
the bf16 search of large lists (:class:`ListBlocks`)."""

from __future__ import annotations

import numpy as np
import scipy.sparse
import torch

__all__ = [
    "LIST_BLOCK",
    "RERANK_MARGIN",
    "RERANK_MEMBERS",
    "SCREEN_KEEP",
    "SCREEN_PAIRS",
    "ListBlocks",
    "bf16_fast",
    "column_lists",
    "fp32_rerank",
    "screen_available",
]

#: Similarities in one (queries, list members) block of the ivf search (64 MB of float32).
LIST_BLOCK = 1 << 24


def column_lists(lists: torch.Tensor, n_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' lists turned into columns' lists: for ``lists`` of shape (n, k), each entry a
    column number below ``n_cols``, returns ``(ptr, order)``, where ``order[ptr[c] :
    ptr[c + 1]]`` are the flat positions (``row * k + slot``) of the entries in column
    ``c``, in row order: a stable sort by column (the entry's row is ``order // k``).

    On the CPU it is scipy's CSR-to-CSC transpose, one counting pass over the entries:
    90,000 x 160 entries in 0.45-0.9 s against 1.2-3.1 s for torch's stable argsort and its
    searchsorted (1 thread). On a GPU, torch's stable argsort, where it is fast.

    >>> ptr, order = column_lists(torch.tensor([[2, 0], [0, 1]]), 3)
    >>> ptr.tolist(), order.tolist()
    ([0, 2, 3, 4], [1, 2, 3, 0])
    """
    n, k = lists.shape
    flat = lists.reshape(-1)
    if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= n_cols):
        raise ValueError(
            f"lists must hold column numbers in [0, {n_cols}); got values from "
            f"{int(flat.min())} to {int(flat.max())}."
        )
    if lists.device.type != "cpu":
        order = torch.argsort(flat, stable=True)
        ptr = torch.searchsorted(flat[order], torch.arange(n_cols + 1, device=lists.device))
        return ptr, order
    positions = np.arange(n * k, dtype=np.int64)
    rows_ptr = np.arange(n + 1, dtype=np.int64) * k
    by_col = scipy.sparse.csr_matrix((positions, flat.numpy(), rows_ptr), shape=(n, n_cols)).tocsc()
    return torch.from_numpy(by_col.indptr.astype(np.int64)), torch.from_numpy(by_col.data)


def bf16_fast(device: torch.device) -> bool:
    """Whether bf16 products (accumulated in fp32) beat float32 ones on ``device``: CUDA,
    or a CPU with AVX512-BF16 (about half the time of a float32 product there; elsewhere
    on a CPU they can be slower)."""
    if device.type == "cuda":
        return True
    check = getattr(torch.cpu, "_is_avx512_bf16_supported", None)
    return device.type == "cpu" and bool(check and check())


def screen_available(x: torch.Tensor) -> bool:
    """Whether the ivf search screens with bf16 products on ``x``'s device: float32
    rows on a CPU where :func:`bf16_fast`."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and bf16_fast(x.device)


#: How far a bf16 product of unit rows may lie from the float32 one: each row rounded to bf16
#: moves by <= 2^-9 of its norm (2^-8 for the pair), the product is rounded once (2^-9), and
#: float32 sums of d terms err by < 2^-14 for d up to 1,000. Measured here: 0.0028 at most.
SCREEN_ERROR = 2.0**-8 + 2.0**-9 + 2.0**-14

#: The screen stops for the rest of a search once it kept this fraction of the members it
#: screened: the bf16 product and the kept ones' float32 product then cost more than float32
#: alone (real MiniLM text kept ~0.6, generated ~0.06: benchmarks/graph/RESULTS.md). Blocks
#: below SCREEN_PAIRS similarities are not screened: a small product of the kept members
#: may round differently in the last bit (MKL's small-matrix kernels; at d = 12 it did).
SCREEN_KEEP, SCREEN_PAIRS = 0.3, 1 << 20

#: The bf16 search of a large list where the screen does not run (``precision="bf16"``,
#: :meth:`ListBlocks.top`): each row's top ``kk + max(RERANK_MARGIN, kk)`` members by one
#: bf16 product, re-ranked by their float32 similarities. bf16 rounding moves a
#: similarity by about 1e-4 (at most :data:`SCREEN_ERROR`), so a member of the float32
#: top ``kk`` is lost only when that many others lie within the rounding of it: on dense
#: generated rows (a row's 1st and 80th neighbours 0.016 apart) 99.5-99.9% of the
#: float32 top 80 kept, the best member kept for 99.97% of rows with ``kk = 1`` (at most
#: 2.2e-4 lower): benchmarks/graph/rerank_micro.py, its figures in benchmarks/graph/RESULTS.md.
RERANK_MARGIN = 7

#: ... run only where a list has at least this many members per candidate row re-ranked:
#: the gather of the candidates' float32 rows costs about as much per candidate as 170
#: members' share of the float32 product, so smaller lists gain nothing (27,000 members
#: and 160 candidates: 0.96 of the float32 time; 90,000: 0.39; 5,000 members and 8: 0.6).
RERANK_MEMBERS = 256

#: Query rows whose candidates' float32 rows are gathered at once (a buffer reused).
RERANK_ROWS = 32


def fp32_rerank(
    queries: torch.Tensor, base: torch.Tensor, cand: torch.Tensor, kk: int, out: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 searches' re-rank: each row of ``queries`` against its own candidate rows of
    ``base`` (``cand``, shape (rows, wide)), gathered into ``out`` (``rows * wide * d``
    floats at least); returns the top ``kk`` float32 similarities and their columns of
    ``cand``, most similar first."""
    near = out[: cand.numel() * base.shape[1]].view(*cand.shape, base.shape[1])
    torch.index_select(base, 0, cand.reshape(-1), out=near.view(-1, base.shape[1]))
    return torch.bmm(near, queries[:, :, None])[:, :, 0].topk(kk, dim=1)


def _chunk_floor(low: torch.Tensor, kk: int) -> torch.Tensor:
    """Each row's ``kk``-th largest maximum over ``4 kk`` strided chunks of its first
    ``width * 4 kk`` columns (:class:`ListBlocks`' floor before the margin), float32 (rows, 1).

    With ``kk == 1`` that is the row's maximum over those columns, taken as one contiguous
    reduction: the strided (rows, width, 4) one cost 65% of the block's bf16 product (3.0
    against 0.26 ms at 370 x 3,200, 1 thread). The ``kk``-th largest is the least of an
    unsorted top ``kk`` (sorting 160 of 640 took 3.5 ms, unsorted 2.1, at 300 rows).

    >>> low = torch.tensor([[1.0, 5.0, 2.0, 4.0, 9.0]]).bfloat16()
    >>> _chunk_floor(low, 1).tolist()
    [[5.0]]
    """
    rows, width = low.shape[0], low.shape[1] // (4 * kk)
    if kk == 1:
        return low[:, : width * 4].amax(1, keepdim=True).float()
    peaks = low[:, : width * 4 * kk].view(rows, width, 4 * kk).amax(1)
    return peaks.topk(kk, dim=1, sorted=False).values.amin(1, keepdim=True).float()


class ListBlocks:
    """The (queries, list members) products of the ivf search, in buffers reused list
    after list (fresh blocks above a worker's 4 MB mmap threshold were faulted in per list).

    The bf16 screen finds a block's top ``kk`` per row in two products. The bf16 one
    (``s~``, within ``e`` = :data:`SCREEN_ERROR` of float32's ``s``) gives a floor: in 4
    ``kk`` strided chunks of the members, a row's ``kk``-th largest chunk maximum ``p`` is
    at most its ``kk``-th largest ``s~``, so its float32 ``kk``-th is >= ``p - e`` and its
    float32 top ``kk`` all have ``s~ >= p - 2e``. The float32 product of the members above
    the floor of any row of the block holds the float32 top ``kk`` of every row.

    With ``rerank`` (the search's ``precision="bf16"``), where the screen does not run
    (stopped, or not available: CUDA), a list of at least :data:`RERANK_MEMBERS` members
    per candidate is searched in bf16 and its candidates re-ranked in float32
    (:meth:`_reranked`): approximate, and faster than the float32 product there. Where
    the screen runs it stays: exact, and faster still (a 1M run's group whose lists it
    screens: 27.3 s, 31.9 s with the bf16 search in its place).
    """

    def __init__(
        self,
        queries: torch.Tensor,
        base: torch.Tensor,
        counts: torch.Tensor,
        q_counts: torch.Tensor,
        screen: bool | None,
        rerank: bool = False,
    ) -> None:
        self.queries, self.base = queries, base
        self.steps = (LIST_BLOCK // counts.clamp_min(1)).clamp(1, 65536)  # block_rows
        most, d = int(counts.max()), base.shape[1]
        self.listed_buf = base.new_empty(most * d)
        self.block_buf = base.new_empty(int((torch.minimum(q_counts, self.steps) * counts).max()))
        self.screen = screen_available(base) if screen is None else screen
        self.rerank, self.rerank_buf = rerank, base.new_empty(0)
        self.screened = self.kept = 0
        if self.screen:
            norms = queries.norm(dim=1).max() * base.norm(dim=1).max()
            self.gap = 2 * SCREEN_ERROR * max(1.0, float(norms)) + 2.0**-8  # 2^-8: the cast
        if self.screen or self.rerank:
            self.q_low = queries.bfloat16()
            # one bf16 copy for a graph's search (the rows against themselves), not two
            self.base_low = self.q_low if base is queries else base.bfloat16()
            self.low_buf = self.base_low.new_empty(most * d)
            self.low_block_buf = self.base_low.new_empty(self.block_buf.numel())

    def load(self, members: torch.Tensor) -> None:
        """Take one list's members; their rows are gathered into the buffers on first use
        (bf16 rows for the screen and the bf16 search, float32 rows for the products)."""
        self.members, self.listed, self.low = members, None, None

    def _low(self) -> torch.Tensor:
        """The bf16 rows of the loaded list's members, gathered on first use."""
        if self.low is None:
            m, d = len(self.members), self.base.shape[1]
            self.low = self.low_buf[: m * d].view(m, d)
            torch.index_select(self.base_low, 0, self.members, out=self.low)
        return self.low

    def _listed(self) -> torch.Tensor:
        """The float32 rows of the loaded list's members, gathered on first use."""
        if self.listed is None:
            m, d = len(self.members), self.base.shape[1]
            self.listed = self.listed_buf[: m * d].view(m, d)
            torch.index_select(self.base, 0, self.members, out=self.listed)
        return self.listed

    def top(self, rows: torch.Tensor, kk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The top ``kk`` members (float32 similarities, positions in the list) of each of
        the query rows ``rows``, most similar first."""
        m, wide = len(self.members), kk + max(RERANK_MARGIN, kk)
        if self.rerank and not self.screen and m >= RERANK_MEMBERS * wide:
            return self._reranked(rows, kk, wide)
        if not self.screen or m < 16 * kk or len(rows) * m < SCREEN_PAIRS:
            block = self.block_buf[: len(rows) * m].view(len(rows), m)
            return torch.mm(self.queries[rows], self._listed().T, out=block).topk(kk, dim=1)
        low = self.low_block_buf[: len(rows) * m].view(len(rows), m)
        torch.mm(self.q_low[rows], self._low().T, out=low)
        floor = _chunk_floor(low, kk) - self.gap
        # Members at or above some row's floor. The bf16 difference keeps its sign, and
        # its column maxima are one pass (a compare then ``any(0)`` was two, twice as long).
        keep = (low.sub_(floor.bfloat16()).amax(0) >= 0).nonzero()[:, 0]
        self.screened, self.kept = self.screened + m, self.kept + len(keep)
        if self.kept > SCREEN_KEEP * self.screened:
            self.screen = False  # the rest of this search: float32 products alone
        s, i = (self.queries[rows] @ self.base[self.members[keep]].T).topk(kk, dim=1)
        return s, keep[i]

    def _reranked(
        self, rows: torch.Tensor, kk: int, wide: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:meth:`top` by the bf16 search: each row's ``wide`` best members by the bf16
        product, then their float32 similarities (the rows gathered :data:`RERANK_ROWS`
        queries at a time into one reused buffer) and the top ``kk`` of those."""
        d = self.base.shape[1]
        low = self.low_block_buf[: len(rows) * len(self.members)].view(len(rows), -1)
        cand = torch.mm(self.q_low[rows], self._low().T, out=low).topk(wide, 1, sorted=False)[1]
        if self.rerank_buf.numel() < RERANK_ROWS * wide * d:
            self.rerank_buf = self.base.new_empty(RERANK_ROWS * wide * d)
        queries, sims = self.queries[rows], self.base.new_empty(len(rows), kk)
        top = torch.empty(len(rows), kk, dtype=torch.long, device=rows.device)
        for lo in range(0, len(rows), RERANK_ROWS):
            part = cand[lo : lo + RERANK_ROWS]
            q = queries[lo : lo + RERANK_ROWS]
            s, i = fp32_rerank(q, self.base, self.members[part], kk, self.rerank_buf)
            sims[lo : lo + RERANK_ROWS], top[lo : lo + RERANK_ROWS] = s, part.gather(1, i)
        return sims, top
