"""The K-NN graph: sparse greedy against brute force, K from the ratio, recall, thread control
and determinism (the swap search on the graph: tests/optim/test_swaps.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from datamask import FacilityLocation, MaskLearner, Objective, make_clustered
from datamask._device import available_cores, resolve_threads, set_threads
from datamask.data import Corpus
from datamask.greedy import DenseGreedy, LazyGreedy
from datamask.neighbors import column_lists, ivf_search, knn_graph, sampled_recall
from datamask.objectives.facility_location import (
    KEPT_NEIGHBORS,
    MAX_NEIGHBORS,
    MIN_NEIGHBORS,
    neighbors_for_ratio,
)


# --- brute force on the graph, in numpy float64 ----------------------------------------------
def graph_j(x: np.ndarray, q: np.ndarray, idx: np.ndarray, rows: list[int], lamb, k) -> float:
    """``lamb * sum_S q / k + (1 - lamb) * mean_i max(0, max_{j in S and N(i)} <x_i, x_j>)``."""
    chosen = set(rows)
    cover = np.zeros(len(x))
    for i in range(len(x)):
        sims = [max(0.0, float(x[i] @ x[j])) for j in idx[i] if j in chosen]
        cover[i] = max(sims, default=0.0)
    return lamb * q[rows].sum() / k + (1 - lamb) * cover.mean()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("n_neighbors", [3, 5])
@pytest.mark.parametrize("lamb", [0.0, 0.4])
def test_sparse_greedy_equals_exhaustive_greedy_on_the_graph(seed, n_neighbors, lamb):
    corpus = make_clustered(22, 5, 3, seed=seed)
    k = 6
    obj = Objective(FacilityLocation(n_neighbors=n_neighbors, knn="exact"), lamb=lamb)
    sel = LazyGreedy(obj, k=k, device="cpu").fit(corpus)
    x = corpus.features.astype(np.float64)
    q = corpus.normalized_quality()
    idx = knn_graph(torch.as_tensor(corpus.features), n_neighbors, method="exact")[0].numpy()
    picked: list[int] = []
    for j in sel.order_.tolist():  # every candidate set scored from scratch
        rest = [i for i in range(len(x)) if i not in picked]
        values = {i: graph_j(x, q, idx, picked + [i], lamb, k) for i in rest}
        # The greedy's pick is the best one (float32 similarities: ties within 1e-6).
        assert values[j] >= max(values.values()) - 1e-6
        picked.append(j)
    term = sel.objective_.terms[1][1]
    assert term.graph_value(torch.as_tensor(picked)) == pytest.approx(
        graph_j(x, q, idx, picked, 0.0, k), abs=1e-6
    )
    assert sel.graph_seconds_ > 0 and sel.optimise_seconds_ > 0


def test_dense_greedy_builds_no_graph_and_sparse_greedy_reports_its_build():
    corpus = make_clustered(400, 16, 8, seed=0)
    dense = DenseGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    sparse = LazyGreedy(select_ratio=0.1, device="cpu").fit(corpus)
    assert dense.graph_seconds_ == 0.0
    assert sparse.graph_seconds_ > 0.0
    assert sparse.fit_seconds_ == pytest.approx(sparse.graph_seconds_ + sparse.optimise_seconds_)
    # On clustered data the graph greedy loses almost nothing against the dense one.
    assert sparse.terms_["J"] >= 0.995 * dense.terms_["J"]


# --- K from the ratio -----------------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.01, 0.05, 0.1, 0.3])
def test_k_from_ratio_keeps_enough_neighbours(ratio):
    n = 50_000
    k = round(ratio * n)
    kk = neighbors_for_ratio(k, n)
    assert MIN_NEIGHBORS <= kk <= MAX_NEIGHBORS
    # Expected kept neighbours per document: KEPT_NEIGHBORS, or 10 at the memory cap.
    assert kk * k / n >= (KEPT_NEIGHBORS if ratio >= 1 / 64 else 10)
    assert kk <= max(MIN_NEIGHBORS, KEPT_NEIGHBORS * n / k + 1)


def test_k_from_ratio_is_capped_by_n_and_bound_into_the_term():
    assert neighbors_for_ratio(1, 30) == 30
    corpus = make_clustered(500, 8, 4, seed=0)
    term = FacilityLocation().bind(torch.as_tensor(corpus.features), torch.zeros(500), 5)
    assert term.n_neighbors_ == neighbors_for_ratio(5, 500) == 500
    fixed = FacilityLocation(n_neighbors=12).bind(torch.as_tensor(corpus.features), None, 50)
    assert fixed.n_neighbors_ == 12
    with pytest.raises(ValueError, match="n_neighbors must be >= 1"):
        FacilityLocation(n_neighbors=0).bind(torch.as_tensor(corpus.features), None, 5)


# --- recall ------------------------------------------------------------------------------------
def test_sampled_recall_measures_the_graph():
    corpus = make_clustered(600, 16, 6, seed=1)
    x = torch.as_tensor(corpus.features)
    idx, _ = knn_graph(x, 20, method="exact")
    assert sampled_recall(x, idx, n_rows=100) == 1.0
    broken = idx.clone()
    gen = torch.Generator().manual_seed(0)
    broken[:, 10:] = torch.randint(0, 600, (600, 10), generator=gen)  # half the lists lost
    r = sampled_recall(x, broken, n_rows=200)
    assert 0.45 <= r <= 0.6
    ivf, _ = knn_graph(x, 20, method="ivf", n_probe=1)
    assert 0.0 < sampled_recall(x, ivf) <= 1.0


@pytest.mark.slow
def test_select_summary_reports_the_graph_and_threads(tmp_path, reference_parquet):
    out = tmp_path / "sel.parquet"
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", str(reference_parquet)]
    cmd += ["--output", str(out), "--select-ratio", "0.1", "--n-epochs", "20"]
    cmd += ["--threads", "1", "--device", "cpu", "--no-progress"]
    subprocess.run(cmd, check=True, capture_output=True, env=_env())
    summary = json.loads(out.with_name("sel.summary.json").read_text())
    assert summary["graph"]["method"] == "exact"
    assert summary["graph"]["recall_sampled"] == 1.0
    assert summary["settings"]["threads"] == 1
    assert summary["seconds"]["graph"] > 0 and summary["seconds"]["optimise"] > 0


# --- threads and determinism -------------------------------------------------------------------
def _env() -> dict[str, str]:
    src = os.path.join(os.path.dirname(__file__), "..", "src")
    return {**os.environ, "PYTHONPATH": os.path.abspath(src)}


@pytest.mark.slow
def test_threads_default_to_the_available_cores_and_are_applied():
    assert resolve_threads() == available_cores() == len(os.sched_getaffinity(0))
    code = (
        "import torch, numpy, threadpoolctl\n"
        "from datamask._device import set_threads\n"
        "set_threads(1)\n"
        "info = threadpoolctl.threadpool_info()\n"
        "print(torch.get_num_threads(), max([i['num_threads'] for i in info] or [1]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True, env=_env()
    )
    assert out.stdout.split() == ["1", "1"]
    with pytest.raises(ValueError, match="threads must be >= 1"):
        resolve_threads(0)
    with pytest.raises(TypeError, match=r"^threads must be >= 1; got 1\.5\.$"):  # one checker
        resolve_threads(1.5)


@pytest.mark.slow
def test_bad_threads_flag_is_one_line_exit_2(tmp_path, reference_parquet):
    cmd = [sys.executable, "-m", "datamask.cli", "select", "--input", str(reference_parquet)]
    cmd += ["--output", str(tmp_path / "s.parquet"), "--threads", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env())
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == ["datamask: error: threads must be >= 1; got 0."]
    assert not (tmp_path / "s.parquet").exists()


def _fit(corpus: Corpus, algorithm: str) -> MaskLearner:
    return MaskLearner(algorithm=algorithm, select_ratio=0.05, n_epochs=40, device="cpu").fit(
        corpus
    )


@pytest.mark.parametrize("algorithm", ["Facility", "Pair_simi"])
def test_same_seed_gives_bit_identical_logits_across_runs_and_thread_counts(algorithm):
    corpus = make_clustered(600, 24, 6, seed=2)
    before = torch.get_num_threads()
    try:
        set_threads(1)
        one = _fit(corpus, algorithm)
        again = _fit(corpus, algorithm)
        set_threads(2)
        two = _fit(corpus, algorithm)
    finally:
        set_threads(before)
    np.testing.assert_array_equal(one.logits_, again.logits_)
    np.testing.assert_array_equal(one.selected_, again.selected_)
    np.testing.assert_array_equal(one.logits_, two.logits_)
    np.testing.assert_array_equal(one.selected_, two.selected_)


def test_faiss_graph_when_installed():
    pytest.importorskip("faiss")
    corpus = make_clustered(2000, 16, 10, seed=4)
    x = torch.as_tensor(corpus.features)
    idx, sim = knn_graph(x, 24, method="faiss", n_probe=44)  # every list: exact search
    assert idx.shape == (2000, 24)
    assert sampled_recall(x, idx) == 1.0
    again, _ = knn_graph(x, 24, method="faiss", n_probe=44)
    assert torch.equal(idx, again)
    assert bool((sim[:, :-1] >= sim[:, 1:]).all())  # most similar first


def test_auto_search_and_default_probes():
    from datamask.neighbors import default_n_probe, resolve_knn

    cpu = torch.device("cpu")
    assert resolve_knn("auto", 20_000, cpu) == "exact"
    assert resolve_knn("auto", 20_001, cpu) == "ivf"  # ours beat faiss on real text
    assert default_n_probe(223, "ivf") == 67 and default_n_probe(223, "faiss") == 45
    with pytest.raises(ValueError, match="knn must be one of"):
        resolve_knn("hnsw", 10, cpu)
    with pytest.raises(ValueError, match=r"^n_probe must be >= 1; got 0\.$"):
        knn_graph(torch.eye(4), 2, method="ivf", n_probe=0)
    with pytest.raises(TypeError, match=r"^n_probe must be >= 1; got 2\.5\.$"):
        knn_graph(torch.eye(4), 2, method="ivf", n_probe=2.5)


def test_ivf_search_probing_every_list_is_brute_force_and_fewer_probes_only_miss():
    gen = torch.Generator().manual_seed(3)
    q = torch.nn.functional.normalize(torch.randn(300, 12, generator=gen), dim=1)
    base = torch.nn.functional.normalize(torch.randn(200, 12, generator=gen), dim=1)
    exact = (q @ base.T).topk(5, dim=1)
    idx, sim = ivf_search(q, base, 5, n_probe=14, n_lists=14)
    assert torch.allclose(sim, exact.values, atol=1e-6)
    idx, sim = ivf_search(q, base, 1, n_probe=2, n_lists=14)
    found = sim[:, 0] > -1
    # every hit is a real pair at its true similarity, never above the best one
    assert torch.allclose(sim[found, 0], (q[found] * base[idx[found, 0]]).sum(1), atol=1e-6)
    assert bool((sim[:, 0] <= exact.values[:, 0] + 1e-6).all())
    _, none = ivf_search(q, base[:0], 1, n_probe=1, n_lists=4)
    assert bool((none == -1).all())


@pytest.mark.parametrize(
    "data",
    [
        "clustered",  # the screen keeps a few members per list and screens every list
        "uniform",  # close similarities: it keeps most members and stops after a few lists
    ],
)
def test_ivf_bf16_screen_finds_the_same_neighbours_as_the_fp32_search(data, monkeypatch):
    """The screen only skips members that cannot be in a row's fp32 top K: the same
    similarities, of real pairs, as the plain fp32 search of the same lists (every block
    screened here, however small)."""
    from datamask import _ivf_lists

    monkeypatch.setattr(_ivf_lists, "SCREEN_PAIRS", 0)
    if data == "clustered":
        x = torch.as_tensor(make_clustered(6000, 96, 40, spread=0.4, seed=2).features)
    else:
        gen = torch.Generator().manual_seed(2)
        x = torch.nn.functional.normalize(torch.randn(6000, 96, generator=gen), dim=1)
    args = dict(n_probe=24, n_lists=77)
    idx, sim = ivf_search(x, x, 64, screen=False, **args)
    idx_s, sim_s = ivf_search(x, x, 64, screen=True, **args)
    assert torch.equal(sim_s, sim)
    assert torch.allclose(sim_s, (x[:, None, :] * x[idx_s]).sum(-1), atol=1e-5)
    # the same rows, but for the choice among exactly equal similarities
    strict = sim > sim[:, -1:]
    assert all(
        set(a[m].tolist()) == set(b[m].tolist()) for a, b, m in zip(idx, idx_s, strict, strict=True)
    )


@pytest.mark.parametrize("k", [1, 64])
def test_ivf_bf16_search_of_large_lists_keeps_the_fp32_top_k_and_its_fp32_sims(k, monkeypatch):
    """``precision="bf16"``: the lists' candidates by one bf16 product, re-ranked in fp32.
    Every list re-ranked here however small: the similarities are fp32 ones of real pairs,
    sorted, and the members are the fp32 search's of the same lists for nearly every row
    (dense clusters: many near-equal similarities for bf16 rounding to reorder)."""
    from datamask import _ivf_lists

    monkeypatch.setattr(_ivf_lists, "RERANK_MEMBERS", 0)
    x = torch.as_tensor(make_clustered(6000, 96, 40, spread=0.4, seed=2).features)
    args = dict(n_probe=24, n_lists=77, screen=False)
    idx, sim = ivf_search(x, x, k, precision="fp32", **args)
    idx_b, sim_b = ivf_search(x, x, k, precision="bf16", **args)
    assert torch.allclose(sim_b, (x[:, None, :] * x[idx_b]).sum(-1), atol=1e-5)
    assert bool((sim_b[:, :-1] >= sim_b[:, 1:]).all())
    assert bool((sim_b <= sim + 1e-5).all())  # never above the fp32 search's k-th best, etc.
    found = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(idx, idx_b, strict=True))
    assert found / idx.numel() >= 0.995
    assert float((sim - sim_b).abs().max()) < 5e-3  # what a bf16 rounding can swap


def test_ivf_precision_auto_is_bf16_only_where_bf16_products_are_fast():
    """``auto`` never makes the exact search bf16 on a CPU (the exact J depends on it);
    the ivf's large lists go bf16 where the CPU has AVX512-BF16."""
    from datamask._ivf_lists import bf16_fast
    from datamask.neighbors import resolve_precision

    cpu = torch.device("cpu")
    assert resolve_precision("auto", cpu) == "fp32"
    assert resolve_precision("auto", cpu, "ivf") == ("bf16" if bf16_fast(cpu) else "fp32")
    assert resolve_precision("fp32", cpu, "ivf") == "fp32"
    with pytest.raises(ValueError, match="precision must be one of"):
        resolve_precision("fp16", cpu)


@pytest.mark.parametrize("kk", [1, 2, 7, 160])
def test_the_screens_floor_is_the_kth_largest_of_its_strided_chunk_maxima(kk):
    """The floor the bf16 screen starts from, against its definition written out: chunk
    ``j`` holds columns ``j, j + 4 kk, j + 8 kk, ...`` of the first ``width * 4 kk``; the
    floor is the ``kk``-th largest chunk maximum (brute force: every chunk by hand, sorted)."""
    from datamask._ivf_lists import _chunk_floor

    gen = torch.Generator().manual_seed(kk)
    for rows, cols in [(1, 4 * kk), (5, 4 * kk * 3 + 1), (33, 4 * kk * 11 + 4 * kk - 1)]:
        low = torch.randn(rows, cols, generator=gen).bfloat16()
        width = cols // (4 * kk)
        want = []
        for row in low.float():
            peaks = [float(row[j : width * 4 * kk : 4 * kk].max()) for j in range(4 * kk)]
            want.append(sorted(peaks, reverse=True)[kk - 1])
        got = _chunk_floor(low, kk)
        assert got.shape == (rows, 1) and got.dtype == torch.float32
        assert got[:, 0].tolist() == want


# --- bf16 search with an fp32 re-rank (the CUDA default, run here on CPU) ----------------------
@pytest.mark.parametrize("budget", [None, 1 << 16])  # one block / many small blocks
def test_bf16_search_reranked_in_fp32_matches_the_fp32_graph(budget):
    from datamask.neighbors import exact_graph

    x = torch.as_tensor(make_clustered(2000, 384, 20, seed=4).features)
    k = 64
    idx32, sim32 = exact_graph(x, k, precision="fp32")
    idx16, sim16 = exact_graph(x, k, precision="bf16", budget=budget)
    hits = [len(set(a) & set(b)) for a, b in zip(idx16.tolist(), idx32.tolist(), strict=True)]
    assert sum(hits) / (2000 * k) >= 0.99  # recall@K against fp32 exact
    assert sampled_recall(x, idx16, n_rows=300) >= 0.99
    # the similarities returned are the fp32 ones of the rows returned, most similar first
    fp32 = (x[:, None, :] * x[idx16]).sum(-1)
    assert torch.allclose(sim16, fp32, atol=1e-6)
    assert bool((sim16[:, :-1] >= sim16[:, 1:]).all())
    assert sim16.dtype == torch.float32 and bool((idx16[:, 0] == torch.arange(2000)).all())


def test_bf16_search_keeps_its_recall_in_dense_clusters():
    """Two clusters of 3,000 nearly equidistant rows, K = 160: the similarities around the
    K-th neighbour lie closer together than bf16 rounds, so a margin of K/4 candidates
    held recall@K 0.98 (as on the H100 at 1M x 384); the margin of K keeps it >= 0.99."""
    from datamask.neighbors import exact_graph

    x = torch.as_tensor(make_clustered(6000, 384, 2, seed=4).features)
    idx16, _ = exact_graph(x, 160, precision="bf16")
    assert sampled_recall(x, idx16, n_rows=500) >= 0.99


def test_precision_resolves_by_device_and_is_checked():
    from datamask.neighbors import resolve_precision

    assert resolve_precision("auto", torch.device("cpu")) == "fp32"
    assert resolve_precision("auto", torch.device("cuda")) == "bf16"  # no CUDA call
    assert resolve_precision("bf16", torch.device("cpu")) == "bf16"
    with pytest.raises(ValueError, match=r"precision must be one of \['auto', 'fp32', 'bf16'\]"):
        knn_graph(torch.eye(4), 2, method="exact", precision="fp16")


@pytest.mark.parametrize(("n_cols", "chunk"), [(1000, 128), (1024, 128), (90, 128), (300, 40)])
def test_row_topk_in_two_stages_is_the_plain_topk(n_cols, chunk):
    from datamask.neighbors import row_topk

    gen = torch.Generator().manual_seed(n_cols)
    scores = torch.randn(7, n_cols, generator=gen)
    k = min(50, n_cols)
    want = scores.topk(k, dim=1)
    vals, cols = row_topk(scores, k, chunk)
    assert torch.equal(vals, want.values) and torch.equal(cols, want.indices)
    assert torch.equal(scores.gather(1, cols), vals)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_chunked_top_k_builds_the_same_graph(precision):
    from datamask.neighbors import exact_graph

    x = torch.as_tensor(make_clustered(900, 64, 9, seed=6).features)
    plain = exact_graph(x, 40, precision=precision, budget=1 << 15)
    chunked = exact_graph(x, 40, precision=precision, budget=1 << 15, topk_chunk=128)
    assert torch.equal(plain[0], chunked[0]) and torch.equal(plain[1], chunked[1])


@pytest.mark.parametrize("shape", [(0, 4), (5, 0), (300, 17)])
def test_column_lists_is_a_stable_sort_by_column(shape):
    n, k = shape
    lists = torch.randint(0, 40, (n, k), generator=torch.Generator().manual_seed(n + k))
    ptr, order = column_lists(lists, 40)
    flat = lists.reshape(-1)
    assert torch.equal(order, torch.argsort(flat, stable=True))  # row order within a column
    assert torch.equal(ptr, torch.searchsorted(flat[order], torch.arange(41)))
    assert ptr.dtype == order.dtype == torch.int64


@pytest.mark.parametrize("bad", [-1, 40])
def test_column_lists_refuses_a_column_out_of_range(bad):
    lists = torch.zeros(5, 3, dtype=torch.long)
    lists[2, 1] = bad  # scipy's transpose would write out of bounds: refused before it
    with pytest.raises(ValueError, match=r"lists must hold column numbers in \[0, 40\)"):
        column_lists(lists, 40)
