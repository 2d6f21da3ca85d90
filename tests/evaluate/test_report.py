"""``datamask report``: the page's numbers against brute force over the whole corpus, the
same page for the same seed whatever the batches or shards, escaping, and bad input."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pyarrow as pa
import pytest
import torch

from datamask.cli import main
from datamask.evaluation.browse import REPORT_SECTIONS, build_report, render_html
from datamask.evaluation.redundancy import redundancy
from datamask.neighbors import assign_clusters
from tests._data import write, write_columns, write_shards


def plt_imread(path):
    from matplotlib.image import imread

    return imread(path)


N, D = 600, 16
WORDS = [
    ["python", "module", "import", "class"],
    ["kernel", "driver", "device", "linux"],
    ["poem", "love", "night", "heart"],
    ["recipe", "flour", "sugar", "butter"],
]


def _corpus(rng: np.random.Generator) -> pa.Table:
    """Four clustered topics, each with its own words; a few near-duplicates; one hostile doc."""
    centers = rng.standard_normal((4, D))
    topic = rng.integers(0, 4, N)
    x = centers[topic] + 0.35 * rng.standard_normal((N, D))
    x[1] = x[0] + 1e-4  # a near-duplicate pair
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    texts = [
        " ".join(rng.choice(WORDS[t], size=int(rng.integers(5, 200)))) + f" doc {i}"
        for i, t in enumerate(topic)
    ]
    texts[0] = '<script>window.pwned = 1; document.title = "x"</script><img src=x onerror=1>'
    return pa.table(
        {
            "chunk_id": [f"d{i:04d}" for i in range(N)],
            "text": texts,
            "quality_score": rng.random(N) + 0.5 * (topic == 0),
            "n_chars": [len(t) for t in texts],
            "feature_arr": pa.FixedSizeListArray.from_arrays(
                pa.array(x.astype(np.float32).ravel()), D
            ),
        }
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    rng = np.random.default_rng(0)
    table = _corpus(rng)
    write(table, root / "docs.parquet", row_group_size=128)
    write_shards(table, root / "shards", 250)
    q = table.column("quality_score").to_numpy()
    top = np.sort(np.argsort(-q)[:60])
    rand = np.sort(rng.choice(N, 90, replace=False))
    ids = np.asarray(table.column("chunk_id").to_pylist())
    # the two forms a selection comes in: select's output (a flag per row) and a list of ids
    # and select's cover columns: each row's nearest kept row by brute force
    x = np.stack(table.column("feature_arr").to_numpy(zero_copy_only=False)).astype(np.float64)
    sims = x @ x[top].T
    cover = top[sims.argmax(1)]
    cover[top] = top
    write_columns(
        root / "topk.parquet",
        chunk_id=ids,
        selected=np.isin(np.arange(N), top),
        covered_by=ids[cover],
        covered_sim=pa.array(np.where(np.isin(np.arange(N), top), 1.0, sims.max(1)), pa.float32()),
        metadata={"datamask.summary": '{"method": "topk", "terms": {"J": 0.5}}'},
    )
    (root / "random.txt").write_text("\n".join(ids[rand]) + "\n")
    return {"root": root, "table": table, "rows": [top, rand], "cover": cover}


def _build(data, source=None, **kw):
    root = data["root"]
    kw = {"n_topics": 4, "sample_size": 300, **kw}
    return build_report(
        str(source or root / "docs.parquet"),
        [str(root / "topk.parquet"), str(root / "random.txt")],
        **kw,
    )


def test_numbers_match_brute_force(data):
    rep = _build(data, batch_size=97)
    t = data["table"]
    q = t.column("quality_score").to_numpy()
    x = np.stack(t.column("feature_arr").to_numpy(zero_copy_only=False)).astype(np.float32)
    lengths = t.column("n_chars").to_numpy().astype(float)
    topic = assign_clusters(torch.from_numpy(x), torch.from_numpy(rep["_centroids"])).numpy()
    assert rep["n_docs"] == N
    assert [tp["n"] for tp in rep["topics"]] == np.bincount(topic, minlength=4).tolist()
    assert rep["quality_all"] == pytest.approx(q.mean())
    assert rep["length_all"] == pytest.approx(lengths.mean())
    assert [s["label"] for s in rep["selections"]] == ["topk", "random"]
    for sel, rows in zip(rep["selections"], data["rows"], strict=True):
        kept = np.zeros(N, bool)
        kept[rows] = True
        assert sel["k"] == len(rows)
        assert sel["quality_kept"] == pytest.approx(q[kept].mean())
        assert sel["quality_dropped"] == pytest.approx(q[~kept].mean())
        assert sel["length_kept"] == pytest.approx(lengths[kept].mean())
        for tt, p in enumerate(sel["topics"]):
            in_t = topic == tt
            assert p["kept"] == int((kept & in_t).sum())
            for key, rows_t in (("q_kept", kept & in_t), ("q_dropped", ~kept & in_t)):
                want = q[rows_t].mean() if rows_t.any() else None
                assert p[key] == pytest.approx(want)
        # the near-duplicate figures are evaluate's, over the kept rows
        assert sel["duplicates"]["thresholds"] == redundancy(x, rows)["thresholds"]
    # histograms: every document counted once, kept ones once per selection
    hist = rep["_quality_hist"]
    assert hist.all.sum() == N
    assert [h.sum() for h in hist.kept] == [len(r) for r in data["rows"]]
    # the topics are the words' clusters: each label is its topic's own four words
    assert sorted(sorted(tp["words"]) for tp in rep["topics"]) == sorted(map(sorted, WORDS))


def test_closest_pair_is_the_planted_duplicate(data):
    rep = build_report(
        str(data["root"] / "docs.parquet"),
        [str(data["root"] / "random.txt")],
        n_topics=3,
        sample_size=200,
        dup_thresholds=[0.5],
    )
    sel = rep["selections"][0]
    if {0, 1} <= set(data["rows"][1].tolist()):
        assert sel["examples"][0]["cosine"] > 0.999
    cos = [e["cosine"] for e in sel["examples"]]
    assert cos == sorted(cos, reverse=True) and len(cos) <= 3


def test_dropped_documents_beside_the_kept_one_covering_them(data):
    from datamask.evaluation.browse import COVER_HIGH, COVER_LOW
    from datamask.evaluation.report_run import _truncate

    report = _build(data)
    top, cover = data["rows"][0], data["cover"]
    texts = data["table"].column("text").to_pylist()
    x = np.stack(data["table"].column("feature_arr").to_numpy(zero_copy_only=False))
    dropped = np.setdiff1d(np.arange(N), top)
    sims = (x[dropped] * x[cover[dropped]]).sum(1)
    order = dropped[np.argsort(-sims, kind="stable")]
    shown = np.concatenate([order[:COVER_HIGH], order[-COVER_LOW:]])
    got = report["selections"][0]["covers"]
    assert [c["dropped"] for c in got] == [_truncate(texts[r]) for r in shown]
    assert [c["kept"] for c in got] == [_truncate(texts[cover[r]]) for r in shown]
    cos = [c["cosine"] for c in got]
    np.testing.assert_allclose(cos, [float(x[r] @ x[cover[r]]) for r in shown], atol=1e-5)
    assert report["selections"][1]["covers"] is None  # an id list names no cover
    page = render_html(report)
    assert "Dropped and what covers them" in page and "names no covering documents" in page


def test_same_seed_same_page_whatever_the_batches_and_shards(data):
    root = data["root"]
    page = render_html(_build(data, batch_size=50))
    assert page == render_html(_build(data, batch_size=1000))
    shards = render_html(_build(data, source=root / "shards"))
    assert shards.replace(str(root / "shards"), "IN") == page.replace(
        str(root / "docs.parquet"), "IN"
    )
    xy = [_build(data, seed=seed)["_map"]["xy"] for seed in (0, 1)]  # another sample
    assert xy[0].shape == xy[1].shape and not np.array_equal(*xy)


def test_page_is_self_contained_and_escaped(data):
    page = render_html(_build(data, sample_size=N))  # the hostile document is in the sample
    for sid in REPORT_SECTIONS:
        assert f'<section id="{sid}">' in page
    assert "<script" not in page and "&lt;script&gt;window.pwned" in page
    assert "onerror=1>" not in page
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", page)
    assert "default-src 'none'" in page  # and the policy forbids scripts and requests


def test_cli_writes_the_page(data, tmp_path, capsys):
    root = data["root"]
    out = tmp_path / "page"
    argv = ["report", "--input", root / "docs.parquet", "--selection", root / "topk.parquet"]
    argv += ["--compare", root / "random.txt", "--output", out, "--topics", "3", "--no-progress"]
    assert main([str(a) for a in argv]) == 0
    assert "wrote" in capsys.readouterr().out
    page = (out / "index.html").read_text()
    assert "topk" in page and "random" in page
    assert [p.name for p in out.iterdir()] == ["index.html"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--topics", "0"], "n_topics must be >= 1; got 0."),
        (["--map", "umap"], None),
        (["--length-col", "nope"], "column 'nope' not found"),
        (["--text-col", "body"], "column 'body' not found"),
    ],
)
def test_cli_refuses_bad_settings(data, tmp_path, capsys, extra, message):
    root = data["root"]
    argv = ["report", "--input", root / "docs.parquet", "--selection", root / "topk.parquet"]
    argv += ["--output", tmp_path / "page", *extra]
    if message is None:
        with pytest.raises(SystemExit):
            main([str(a) for a in argv])
        return
    assert main([str(a) for a in argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "page" / "index.html").exists()


def test_selection_of_another_corpus_is_refused(data, tmp_path):
    other = tmp_path / "other.txt"
    other.write_text("d0001\nnot-an-id\n")
    with pytest.raises(ValueError, match=r"1 of the 2 ids in .*other.txt are not in"):
        build_report(str(data["root"] / "docs.parquet"), [str(other)], n_topics=2)


# --- as a person sees it: the page in headless Chromium ------------------------------------
def _browser():
    """A headless Chromium driven over the DevTools protocol by Debian's chromedriver (the
    paths given explicitly: Selenium Manager never downloads anything); skipped when
    missing, except under CI=true, where a missing browser fails."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    missing = [
        name
        for name, found in (
            ("chromium", chromium),
            ("chromedriver", driver),
            ("selenium", webdriver),
        )
        if found is None
    ]
    if missing:
        why = f"{', '.join(missing)} not installed (apt-get install chromium chromium-driver)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI=true and {why}")
        pytest.skip(why)
    from selenium.webdriver.chrome.service import Service

    os.environ.setdefault("SE_OFFLINE", "true")
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,2000",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
    ):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)


@pytest.mark.slow
def test_page_in_a_browser(data, tmp_path):
    out = tmp_path / "page"
    root = data["root"]
    argv = ["report", "--input", root / "docs.parquet", "--selection", root / "topk.parquet"]
    argv += ["--compare", root / "random.txt", "--output", out, "--topics", "4"]
    argv += ["--sample", str(N), "--no-progress"]  # every document, the hostile one too
    assert main([str(a) for a in argv]) == 0
    page = (out / "index.html").resolve()
    browser = _browser()
    try:
        browser.get(page.as_uri())
        title = browser.title
        shot = tmp_path / "page.png"
        assert browser.save_screenshot(str(shot))
        js = browser.execute_script
        sections = js(
            "return Array.from(document.querySelectorAll('section')).map("
            "s => [s.id, s.querySelector('h2').innerText, s.getBoundingClientRect().height])"
        )
        images = js(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, "
            "i.src.slice(0, 22)])"
        )
        hostile = {
            "pwned": js("return typeof window.pwned"),
            "scripts": js("return document.scripts.length"),
            "shown": js("return document.body.textContent.includes('<script>window.pwned = 1;')"),
            "img_x": js("return document.querySelectorAll('img[src=x]').length"),
        }
        console = browser.get_log("browser")
        events = [json.loads(e["message"])["message"] for e in browser.get_log("performance")]
    finally:
        browser.quit()
    assert title.startswith("datamask report: topk, random")
    assert [s[0] for s in sections] == list(REPORT_SECTIONS)
    assert all(s[1] and s[2] > 20 for s in sections), sections
    assert len(images) == 4  # topic shares, quality, length, map
    assert all(
        done and width > 100 and src == "data:image/png;base64," for done, width, src in images
    )
    assert hostile == {"pwned": "undefined", "scripts": 0, "shown": True, "img_x": 0}
    assert [e for e in console if e["level"] in ("SEVERE", "WARNING")] == []
    urls = [
        e["params"]["request"]["url"] for e in events if e["method"] == "Network.requestWillBeSent"
    ]
    assert page.as_uri() in urls  # the log sees requests: the page's own
    assert [u for u in urls if not u.startswith(("file:", "data:"))] == []
    pixels = plt_imread(shot)
    assert pixels.shape[1] >= 1000 and pixels.std() > 0.05  # drawn, not blank


def test_save_to_disk_folder_gives_the_same_page(data, tmp_path):
    datasets = pytest.importorskip("datasets")
    folder = tmp_path / "saved"
    datasets.Dataset(data["table"]).save_to_disk(str(folder), max_shard_size="100KB")
    assert len(list(folder.glob("*.arrow"))) > 1  # several Arrow files, streamed in order
    root = data["root"]
    page = render_html(_build(data, source=folder))
    same = render_html(_build(data))
    assert page.replace(str(folder), "IN") == same.replace(str(root / "docs.parquet"), "IN")


def test_ids_of_a_text_file_match_integer_ids(tmp_path, data):
    t = data["table"]
    t = t.set_column(0, "chunk_id", pa.array(np.arange(N, dtype=np.int64) * 7))
    write(t, tmp_path / "int.parquet")
    (tmp_path / "ids.txt").write_text("0\n7\n700\n")
    rep = build_report(str(tmp_path / "int.parquet"), [str(tmp_path / "ids.txt")], n_topics=2)
    assert rep["selections"][0]["k"] == 3


@pytest.mark.parametrize("ci", ["true", None])
def test_missing_browser_skips_except_under_ci(monkeypatch, tmp_path, ci):
    monkeypatch.setenv("PATH", str(tmp_path))  # no chromium, no chromedriver
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    expected = pytest.fail.Exception if ci == "true" else pytest.skip.Exception
    with pytest.raises(expected, match="chromium, chromedriver"):
        _browser()
