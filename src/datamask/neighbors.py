"""Nearest neighbours and spherical k-means on unit vectors, in torch (CPU or CUDA)."""

from __future__ import annotations

import math

import torch

from ._copies import first_identical, identical_leads
from ._ivf_lists import ListBlocks, bf16_fast, column_lists, fp32_rerank
from ._validation import check_count

__all__ = [
    "AUTO_EXACT_MAX",
    "COVER_EXACT_PAIRS",
    "FLOOR_PROBE_FRACTION",
    "PROBE_FRACTION",
    "best_match",
    "block_rows",
    "column_lists",
    "default_n_probe",
    "exact_graph",
    "first_identical",
    "identical_leads",
    "ivf_search",
    "KNN_METHODS",
    "knn_graph",
    "PRECISIONS",
    "resolve_precision",
    "row_topk",
    "resolve_knn",
    "sampled_recall",
    "spherical_kmeans",
]

KNN_METHODS = ("auto", "exact", "ivf", "faiss")

#: Arithmetic of the searches' similarity blocks: ``fp32``, or ``bf16`` blocks whose
#: candidates are re-ranked in fp32 (``auto``: :func:`resolve_precision`).
PRECISIONS = ("auto", "fp32", "bf16")

#: Candidates per row the bf16 search keeps beyond K for its fp32 re-rank: bf16 keeps 8
#: bits of mantissa, so similarities within about 1e-2 of the K-th can swap places; the
#: re-rank restores fp32 order and values among ``K + margin`` candidates, the margin
#: max(32, K). A margin of K/4 held recall@K to 0.977 on a GPU at 1M x 384 and to 0.98 on
#: the CPU on make_clustered(6000, 384, 2); max(32, K) gives 1.0 on the latter and 0.99985
#: on the GPU (benchmarks/gpu/RESULTS.md, the graph figure).
BF16_MARGIN = (32, 1.0)

#: ``auto`` compares every pair up to this many rows on CPU (always on CUDA).
AUTO_EXACT_MAX = 20_000

#: The approximate searches probe this fraction of their lists by default: on real MiniLM
#: embeddings (13k documents, 115 to 316 lists) recall@160 was 0.958-0.962 for ivf at 0.3
#: and 0.958 for faiss at 0.2 (docs/method.md "The neighbour graph").
PROBE_FRACTION = {"ivf": 0.3, "faiss": 0.2}


#: A search against kept rows (:func:`best_match`: the exchange round's floors, the floors
#: of ``--given``, :func:`nearest_kept`) probes this fraction of its lists when it is
#: approximate (:func:`ivf_search`, sqrt(kept) lists). A best cosine the search misses is a
#: little low, so a floor made from it makes a selection buy a little more coverage than it
#: needs, never less. Measured against all pairs (benchmarks/scale/SHARDED.md): on real
#: MiniLM rows 0.2 found the exact best cosine for 97.8% of rows (mean shortfall 0.001) at
#: a fifth of the pairs.
FLOOR_PROBE_FRACTION = 0.2

#: :func:`nearest_kept` compares rows with every kept row (blocked matmul, exact) when
#: rows x kept is at most this many pairs; above it, it runs the ivf search (about a
#: fifth of the pairs, :data:`FLOOR_PROBE_FRACTION`, plus its k-means). 2^22 pairs at
#: d=384 are 3.2 GFLOP, a fraction of a second of one CPU core; at 2^25 a sharded group
#: of 10,000 rows keeping 1,000 compared every pair and the cover step of the 200k
#: benchmark took longer (benchmarks/covered/).
COVER_EXACT_PAIRS = 1 << 22


def default_n_probe(n_lists: int, method: str = "ivf") -> int:
    """Probes of ``ivf``/``faiss`` when none is given: ``ceil(PROBE_FRACTION * n_lists)``."""
    return max(1, math.ceil(PROBE_FRACTION.get(method, PROBE_FRACTION["ivf"]) * n_lists))


def faiss_available() -> bool:
    """Whether the optional faiss package can be imported."""
    try:
        import faiss  # noqa: F401
    except ImportError:
        return False
    return True


#: Elements in one block of similarities on CUDA (1 GiB of float32): the graph's and the
#: exact objective's blocks there.
CUDA_BLOCK = 1 << 28


def resolve_knn(method: str, n: int, device: torch.device) -> str:
    """The search ``knn_graph`` runs: ``auto`` -> exact on CUDA or n <= AUTO_EXACT_MAX, else
    ivf (ours). faiss only when asked for: on the full 56k real-text corpus our ivf reached
    recall@160 0.969 in 19 CPU s where faiss IVFFlat took 81 CPU s for 0.955
    (benchmarks/realtext/RESULTS.md, knn); at 13k the two cost about the same."""
    if method not in KNN_METHODS:
        raise ValueError(f"knn must be one of {list(KNN_METHODS)}; got {method!r}.")
    if method == "faiss" and not faiss_available():
        raise ImportError("knn='faiss' needs faiss: pip install 'datamask[faiss]'.")
    if method == "auto":
        if device.type == "cuda" or n <= AUTO_EXACT_MAX:
            return "exact"
        return "ivf"
    return method


def resolve_precision(precision: str, device: torch.device, method: str = "exact") -> str:
    """``auto`` -> ``bf16`` on CUDA (the matrix units run bf16 about 15 times faster than
    fp32); on a CPU ``fp32`` for the ``exact`` search (its blocks are too small for the
    re-rank to pay: every row's candidates are gathered) and, for the ``ivf`` search,
    ``bf16`` where the CPU has AVX512-BF16 (:func:`~datamask._ivf_lists.bf16_fast`: only
    its large lists are searched so, :data:`~datamask._ivf_lists.RERANK_MEMBERS`)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}; got {precision!r}.")
    if precision == "auto":
        fast = device.type == "cuda" or (method == "ivf" and bf16_fast(device))
        return "bf16" if fast else "fp32"
    return precision


def best_match(
    queries: torch.Tensor,
    base: torch.Tensor,
    *,
    method: str = "auto",
    probe_fraction: float = FLOOR_PROBE_FRACTION,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor, str]:
    """Each query's most similar row of ``base`` (unit rows): ``(sims, index, method)``.

    ``exact`` compares every pair in fp32, in blocks of about 16M similarities (256M on
    CUDA: memory bounded by the block, not by ``len(queries) * len(base)``; ties to the
    lowest row); ``ivf`` is
    :func:`ivf_search` with one neighbour, sqrt(len(base)) lists and ``probe_fraction`` of
    them probed (its k-means drawn from ``generator``).
    ``auto``: exact up to ``AUTO_EXACT_MAX ** 2`` pairs (the graph's own limit) or on CUDA,
    else ivf. ``sims`` is not clipped; ``index`` is -1 where no row was found (empty
    ``base``, or a query whose probed lists were empty: its sim is then -1). The method run
    is returned, for the summary.

    >>> x = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    >>> sims, index, how = best_match(x, torch.tensor([[0.6, 0.8]]))
    >>> [round(v, 2) for v in sims.tolist()], index.tolist(), how
    ([0.6, 0.8], [0, 0], 'exact')
    """
    n, nb = queries.shape[0], base.shape[0]
    if method == "auto":
        exact = queries.device.type == "cuda" or n * nb <= AUTO_EXACT_MAX**2
        method = "exact" if exact else "ivf"
    if method not in ("exact", "ivf"):
        raise ValueError(f"best_match method must be 'auto', 'exact' or 'ivf'; got {method!r}.")
    sims = torch.full((n,), -1.0, dtype=queries.dtype, device=queries.device)
    index = torch.full((n,), -1, dtype=torch.long, device=queries.device)
    if nb == 0 or n == 0:
        return sims, index, method
    if method == "ivf":
        n_lists = max(1, int(math.sqrt(nb)))
        idx, found = ivf_search(
            queries,
            base.to(queries.dtype),
            1,
            n_probe=max(1, math.ceil(probe_fraction * n_lists)),
            n_lists=n_lists,
            generator=generator,
        )
        hit = found[:, 0] > -1.0  # padding: no row in the probed lists
        sims[hit], index[hit] = found[hit, 0], idx[hit, 0]
        # copies of one vector tie: the list's top-1 may be any of them, the rule is the first
        index[hit] = first_identical(base, index[hit])
        return sims, index, method
    step = block_rows(nb, budget=1 << 24, device=queries.device)
    base = base.to(queries.dtype)
    for lo in range(0, n, step):
        s, i = (queries[lo : lo + step] @ base.T).max(dim=1)
        sims[lo : lo + step], index[lo : lo + step] = s, i
    # copies of one vector tie; a product's rounding may still differ by a column's place
    return sims, first_identical(base, index), method


def block_rows(n_cols: int, budget: int = 1 << 26, device: torch.device | None = None) -> int:
    """Rows per block so that a (rows, n_cols) float32 block stays near ``budget`` elements;
    on CUDA (``device``) near :data:`CUDA_BLOCK` at least, where each block's few kernel
    launches cost more than its memory (the exact J of 1M rows against 100k kept ones took
    24,000 blocks of 41 rows on an H200)."""
    if device is not None and device.type == "cuda":
        budget = max(budget, CUDA_BLOCK)
    return max(1, min(65536, budget // max(n_cols, 1)))


def spherical_kmeans(
    x: torch.Tensor,
    n_clusters: int,
    *,
    n_iter: int = 10,
    sample: int | None = 100_000,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Centroids (unit rows, shape (n_clusters, d)) by Lloyd's algorithm on cosine similarity.

    Fitted on a random ``sample`` of rows when the input is larger; empty clusters are
    re-seeded from random rows.
    """
    n = x.shape[0]
    n_clusters = min(n_clusters, n)
    gen_dev = generator.device if generator is not None else x.device
    if sample is not None and n > sample:
        rows = torch.randperm(n, generator=generator, device=gen_dev)[:sample].to(x.device)
        x = x[rows]
        n = sample
    start = torch.randperm(n, generator=generator, device=gen_dev)[:n_clusters].to(x.device)
    cent = x[start].clone()
    for _ in range(n_iter):
        assign = assign_clusters(x, cent)
        sums = torch.zeros_like(cent).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=n_clusters)
        empty = counts == 0
        if empty.any():
            refill = torch.randint(
                0, n, (int(empty.sum()),), generator=generator, device=gen_dev
            ).to(x.device)
            sums[empty] = x[refill]
        cent = torch.nn.functional.normalize(sums, dim=1)
    return cent


def assign_clusters(x: torch.Tensor, centroids: torch.Tensor, top: int = 1) -> torch.Tensor:
    """Index of the most similar centroid per row (shape (n,), or (n, top) when top > 1).

    In blocks of 4M similarities (16 MB in float32): at 1,000 centroids a block of the
    default 64M was 262 MB, the largest thing in the k-means fit step
    (benchmarks/driver/RESULTS.md)."""
    out = []
    step = block_rows(centroids.shape[0], budget=1 << 22)
    for lo in range(0, x.shape[0], step):
        sims = x[lo : lo + step] @ centroids.T
        out.append(sims.argmax(1) if top == 1 else sims.topk(top, dim=1).indices)
    return torch.cat(out)


def knn_graph(
    x: torch.Tensor,
    n_neighbors: int,
    *,
    method: str = "auto",
    n_probe: int | None = None,
    n_lists: int | None = None,
    generator: torch.Generator | None = None,
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``n_neighbors`` most similar rows of every row (itself included), sorted.

    Parameters
    ----------
    x : float tensor of shape (n, d)
        Unit rows.
    n_neighbors : int
        K, capped at n.
    method : {"auto", "exact", "ivf", "faiss"}, default="auto"
        ``exact`` compares every pair in blocks (O(n^2 d), best on GPU or small n);
        ``ivf`` clusters the rows (spherical k-means, about sqrt(n) clusters), files every
        row under its ``n_probe`` nearest centroids and searches, for each row, only the
        rows filed under its own nearest centroid: O(n^1.5 d n_probe) and approximate.
        ``faiss`` is faiss' ``IndexIVFFlat`` (inner product, sqrt(n) lists, ``n_probe``
        lists searched per row; needs ``pip install datamask[faiss]``).
        ``auto``: see :func:`resolve_knn`.
    n_probe : int, optional
        Probes of ``ivf``/``faiss``; default :func:`default_n_probe` of the list count.
        More probes: higher recall, proportionally more time.
    n_lists : int, optional
        Clusters (inverted lists) of ``ivf``/``faiss``; default sqrt(n).
    generator : torch.Generator, optional
        Draws of the ivf k-means. Default: a generator seeded with 0, so the graph depends
        on the input alone, never on torch's global random state.
    precision : {"auto", "fp32", "bf16"}, default="auto"
        Arithmetic of the ``exact`` search (:func:`exact_graph`) and of the ``ivf``
        search's large lists (:func:`ivf_search`); ``auto``: :func:`resolve_precision`.
        faiss is fp32.

    Returns
    -------
    indices : int64 tensor (n, K) and sims : float tensor (n, K), most similar first.
    """
    n = x.shape[0]
    k = min(n_neighbors, n)
    n_clusters = max(1, min(n, int(math.sqrt(n)) if n_lists is None else int(n_lists)))
    method = resolve_knn(method, n, x.device)
    precision = resolve_precision(precision, x.device, method)
    n_probe = default_n_probe(n_clusters, method) if n_probe is None else n_probe
    check_count("n_probe", n_probe)
    if method == "faiss":
        return _faiss_graph(x, k, n_probe, n_clusters)
    if method == "exact":
        return exact_graph(x, k, precision=precision)
    return ivf_search(
        x, x, k, n_probe=n_probe, n_lists=n_clusters, generator=generator, precision=precision
    )


def row_topk(scores: torch.Tensor, k: int, chunk: int | None = None) -> tuple[torch.Tensor, ...]:
    """``scores.topk(k, dim=1)`` (values, indices), optionally in two stages: the top ``k``
    of every ``chunk`` columns, then the top ``k`` of those. The same result (up to the
    order of equal values: every row's top ``k`` is in the top ``k`` of its own chunk);
    on a GPU, many short rows may select faster than one long one (``benchmarks/gpu``
    times both)."""
    n = scores.shape[1]
    if chunk is None or k >= chunk or n <= chunk:
        return scores.topk(k, dim=1)
    full = n - n % chunk
    vals, cols = scores[:, :full].unflatten(1, (-1, chunk)).topk(k, dim=2)
    cols = cols + torch.arange(0, full, chunk, device=scores.device)[None, :, None]
    vals, cols = vals.flatten(1), cols.flatten(1)
    if full < n:  # the last, shorter chunk
        tail_vals, tail_cols = scores[:, full:].topk(min(k, n - full), dim=1)
        vals = torch.cat([vals, tail_vals], 1)
        cols = torch.cat([cols, tail_cols + full], 1)
    top, pos = vals.topk(k, dim=1)
    return top, cols.gather(1, pos)


def exact_graph(
    x: torch.Tensor,
    k: int,
    *,
    precision: str = "auto",
    budget: int | None = None,
    topk_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact ``k`` most similar rows of every row of ``x``, by blocked matmul + top-k.

    Rows are compared in blocks of about ``budget`` similarities (default 16M on CPU,
    256M on CUDA, where small blocks leave the chip idle), written into the graph in
    place: the graph's own memory, not the blocks, sets the peak, and no n x n matrix is
    ever formed (1M rows x 384 on CUDA: blocks of 268 x 1M). ``topk_chunk`` selects each
    block's top in two stages (:func:`row_topk`).

    With ``precision="bf16"`` each block is one bf16 product (fp32 accumulation) whose
    top ``k + max(32, k)`` candidates are re-ranked by their fp32 similarities, so
    the similarities returned are the fp32 ones, in fp32 order; a true neighbour is
    missed only when bf16 rounding pushes it below that many others (recall@K >= 0.99 on
    clustered data, dense clusters too, ``tests/test_neighbors.py``).

    Returns ``(indices, sims)``, each of shape (n, k), most similar first.
    """
    precision = resolve_precision(precision, x.device)
    n = x.shape[0]
    k = min(k, n)
    if budget is None:
        budget = CUDA_BLOCK if x.device.type == "cuda" else 1 << 24
    idx = torch.empty(n, k, dtype=torch.long, device=x.device)
    sim = torch.empty(n, k, dtype=x.dtype, device=x.device)
    step = block_rows(n, budget=budget)
    if precision == "fp32":
        for lo in range(0, n, step):
            if topk_chunk is None:
                block = x[lo : lo + step] @ x.T
                torch.topk(block, k, dim=1, out=(sim[lo : lo + step], idx[lo : lo + step]))
            else:
                sim[lo : lo + step], idx[lo : lo + step] = row_topk(
                    x[lo : lo + step] @ x.T, k, topk_chunk
                )
        return idx, sim
    low = x.to(torch.bfloat16)  # one bf16 copy: half the bytes of x
    wide = min(n, k + max(BF16_MARGIN[0], int(k * BF16_MARGIN[1])))
    step = max(1, min(step, budget // (wide * x.shape[1])))  # the re-rank's gather, bounded
    gathered = x.new_empty(step * wide * x.shape[1])  # the re-rank's rows, one buffer
    for lo in range(0, n, step):
        cand = row_topk(low[lo : lo + step] @ low.T, wide, topk_chunk)[1]
        s, i = fp32_rerank(x[lo : lo + step], x, cand, k, gathered)
        sim[lo : lo + step], idx[lo : lo + step] = s, cand.gather(1, i)
    return idx, sim


def ivf_search(
    queries: torch.Tensor,
    base: torch.Tensor,
    k: int,
    *,
    n_probe: int,
    n_lists: int,
    generator: torch.Generator | None = None,
    screen: bool | None = None,
    precision: str = "auto",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most similar rows of ``base`` for every row of ``queries`` (unit rows), by
    our ivf: ``base`` is clustered (spherical k-means, ``n_lists`` clusters), every base row
    filed under its ``n_probe`` nearest centroids, and each query compared only with the
    rows filed under its own nearest centroid. Approximate: a true neighbour filed under
    none of the probed lists is missed.

    Returns ``(indices into base, sims)``, each of shape (len(queries), k), most similar
    first; where a list holds fewer than ``k`` rows the rest is padding at similarity -1
    (index: the query's own row number), never ranked above a real row.

    ``screen`` (None: where :func:`~datamask._ivf_lists.screen_available`): a bf16 product
    first, then the fp32 one of only the members that can still be in a row's top ``k``
    (:class:`~datamask._ivf_lists.ListBlocks`): the same neighbours as without it, up to the
    choice among exactly equal similarities.

    ``precision="bf16"`` (``auto``: :func:`resolve_precision`): where the screen stops, a
    long list's top ``k + max(7, k)`` by one bf16 product, re-ranked in fp32 (approximate:
    :class:`~datamask._ivf_lists.ListBlocks`).
    """
    n, nb = queries.shape[0], base.shape[0]
    out_idx = torch.empty(n, k, dtype=torch.long, device=queries.device)
    out_sim = torch.empty(n, k, dtype=queries.dtype, device=queries.device)
    if nb == 0 or n == 0:
        out_idx[:] = torch.arange(n, device=queries.device)[:, None]
        out_sim.fill_(-1.0)
        return out_idx, out_sim
    n_lists = max(1, min(nb, n_lists))
    if generator is None:  # never torch's global RNG: the same input gives the same graph
        generator = torch.Generator(device=base.device).manual_seed(0)
    cent = spherical_kmeans(
        base, n_lists, n_iter=6, sample=min(nb, 20 * n_lists + 10_000), generator=generator
    )
    probe = assign_clusters(base, cent, top=min(n_probe, n_lists))
    probe = probe if probe.ndim == 2 else probe[:, None]
    per_row = probe.shape[1]
    home = probe[:, 0].clone() if queries is base else assign_clusters(queries, cent)
    # Members of each cluster's inverted list: every row filed under any of its probes, in
    # row order. Flat entry e belongs to row e // per_row, so the sort's order becomes the
    # rows in place: no second (n * per_row) list of owners and no sorted copy of the lists.
    bounds, owners = column_lists(probe, n_lists)
    counts = bounds.diff()
    del probe
    owners.div_(per_row, rounding_mode="floor")
    q_order = torch.argsort(home, stable=True)
    q_bounds = torch.searchsorted(home[q_order], torch.arange(n_lists + 1, device=home.device))
    bf16 = resolve_precision(precision, base.device, "ivf") == "bf16"
    blocks = ListBlocks(queries, base, counts, q_bounds.diff(), screen, rerank=bf16)
    for c in range(n_lists):
        in_list = q_order[q_bounds[c] : q_bounds[c + 1]]
        if len(in_list) == 0:
            continue
        members = owners[bounds[c] : bounds[c + 1]]
        kk = min(k, len(members))
        blocks.load(members)
        # Queries in blocks: a list can be home to most queries (all of them near one part
        # of ``base``), and its (queries, members) block must stay bounded all the same.
        step = int(blocks.steps[c])
        for lo in range(0, len(in_list), step):
            rows = in_list[lo : lo + step]
            s, i = blocks.top(rows, kk)
            if kk < k:  # tiny list: pad with the query's row at similarity -1 (never first)
                pad = k - kk
                s = torch.cat([s, s.new_full((len(rows), pad), -1.0)], 1)
                i = torch.cat([members[i], rows[:, None].expand(-1, pad)], 1)
                out_idx[rows], out_sim[rows] = i, s
                continue
            out_idx[rows], out_sim[rows] = members[i], s
    return out_idx, out_sim


def _faiss_graph(
    x: torch.Tensor, k: int, n_probe: int, n_lists: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """K-NN graph by faiss ``IndexIVFFlat`` (inner product), seeded k-means."""
    import faiss

    xs = x.detach().float().cpu().contiguous().numpy()
    n, d = xs.shape
    faiss.omp_set_num_threads(torch.get_num_threads())
    quantizer = faiss.IndexFlatIP(d)
    index = faiss.IndexIVFFlat(quantizer, d, n_lists, faiss.METRIC_INNER_PRODUCT)
    index.cp.seed = 0  # the same input gives the same graph
    index.cp.niter = 10
    index.train(xs[: min(n, 20 * n_lists + 10_000)] if n > 0 else xs)
    index.add(xs)
    index.nprobe = min(n_probe, n_lists)
    sims, idx = index.search(xs, k)
    idx_t = torch.from_numpy(idx).to(x.device)
    sim_t = torch.from_numpy(sims).to(x.device, x.dtype)
    missing = idx_t < 0  # fewer than k rows in the probed lists: the row itself at -1
    if bool(missing.any()):
        rows = torch.arange(n, device=x.device)[:, None].expand(-1, k)
        idx_t = torch.where(missing, rows, idx_t)
        sim_t = sim_t.masked_fill(missing, -1.0)
    return idx_t, sim_t


def sampled_recall(
    x: torch.Tensor, indices: torch.Tensor, *, n_rows: int = 200, seed: int = 0
) -> float:
    """recall@K of a K-NN graph on ``n_rows`` random rows, against the exact K neighbours.

    For each sampled row, the fraction of its exact K most similar rows (itself included)
    that the graph lists, averaged; a listed row as similar as the exact K-th counts as a
    hit (ties among equally similar rows are not misses). Costs ``n_rows x n x d``.
    """
    n, k = indices.shape
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    rows = torch.randperm(n, generator=gen)[: min(n_rows, n)].to(x.device)
    kth = (x[rows] @ x.T).topk(k, dim=1).values[:, -1:]
    listed = indices[rows].sort(dim=1).values
    unique = torch.ones_like(listed, dtype=torch.bool)
    unique[:, 1:] = listed[:, 1:] != listed[:, :-1]  # padding repeats a row: count it once
    sims = (x[rows][:, None, :] * x[listed]).sum(-1)
    hits = ((sims >= kth - 1e-6) & unique).sum(1).clamp_max(k)
    return float(hits.double().mean() / k)
