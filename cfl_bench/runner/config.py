"""Run configuration: every option declared once; defaults < YAML file < command line.

Why one declaration per option: the CLI flags of ``cfl-bench run`` (and their ``--help``),
the YAML schema of ``--config``, the grid keys of ``cfl-bench sweep``, validation and the
``config`` block of ``config.json`` are all generated from the fields of :class:`RunConfig`
and the :class:`OptionSpec` in each field's metadata. A new option is one field here; no
parallel list can drift out of date.

Types are strict wherever a value comes from: booleans are only ``true``/``false``, numbers
are finite, integers are integers, strings are strings. A value of the wrong type (YAML
``overwrite: "no"``, ``stream: 7``, ``lr: .inf``) is refused with one sentence instead of
being coerced into something the user did not mean.

The fully resolved config is written to ``config.json`` and its protocol part is hashed, so
two runs are comparable exactly when their protocol hashes match. The protocol is every
option whose spec says ``protocol=True``: everything except the strategy, the seed and
where/how the run executes (device, threads, paths, output, checkpoints).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Any

from cfl_bench.core.atomic import path_kind
from cfl_bench.core.errors import UserError
from cfl_bench.core.text_values import FLOAT_TEXT, INT_TEXT, quoted, utf8_text
from cfl_bench.engine.lr_schedule import LR_SCHEDULES
from cfl_bench.engine.task_order import check_task_order_text
from cfl_bench.runner.trackers import parse_trackers
from cfl_bench.streams.class_order import NATURAL, check_class_order_text

BUFFER_OFFER = ("first_pass", "every_step")
WEIGHTING = ("samples", "uniform")
OPTIMIZERS = ("sgd", "adam")
AMP_MODES = ("off", "bf16", "fp16")
# --heads: the stream's own output, or one head per task (streams.task_heads).
HEADS = ("shared", "per-task")
EXECUTORS = ("sequential", "vectorized", "flower")
DEVICES = ("auto", "cpu", "cuda")
# Words that mean "not set" where a value arrives as text in a sweep (``--set tasks=none``).
NULL_WORDS = frozenset({"none", "null"})
MAX_SEED = 2**63 - 1
# Upper bounds no real run reaches, so that a slip (--tasks 1000000000) is refused at once
# instead of hanging while the stream, the schedule or the cost estimate is built.
MAX_TASKS = 1_000
MAX_TOTAL_ROUNDS = 100_000  # tasks × rounds per task + --lead-rounds + --async-shift
MAX_CLIENT_ROUNDS = 10_000_000  # total rounds × --clients: the estimate walks every one
MAX_EPOCHS = 1_000
MAX_BATCH = 100_000  # the cost probe materialises one batch of real inputs
MAX_BUFFER = 1_000_000


@dataclass(frozen=True)
class OptionSpec:
    """What one run option is: its help, range, choices and role.

    ``minimum``/``maximum`` bound numbers (inclusive unless ``*_exclusive``); ``choices``
    lists the allowed strings; ``protocol`` says whether the value changes what is measured
    (it then enters the protocol hash); ``flag_off`` names the negative flag of a boolean
    (default ``no-<name>``); ``default_text`` is how ``--help`` shows a default that is
    resolved later (e.g. "the stream's"); ``execution`` marks options that change how a run
    executes and its results at most in float rounding (the executor, ``--compile``,
    ``--channels-last``; left out of a sweep point's identity while at default);
    ``grammar`` checks a text value beyond its type (raising ValueError("must …")) and
    ``grammar_text`` says in words what it accepts.
    """

    help: str
    minimum: float | None = None
    maximum: float | None = None
    minimum_exclusive: bool = False
    maximum_exclusive: bool = False
    choices: tuple[str, ...] = ()
    protocol: bool = True
    flag_off: str | None = None
    default_text: str | None = None
    execution: bool = False
    grammar: Callable[[str], object] | None = None
    grammar_text: str = ""


def check_path_text(text: str) -> str:
    """A path that every later step can write, print and read back as one line: UTF-8 (an
    undecodable byte arrives as a surrogate escape) and free of control characters (a
    newline would split every message and listing that names the run)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be UTF-8 text") from None
    if any(ord(ch) < 32 or ord(ch) == 127 for ch in text):
        raise ValueError("must not hold control characters")
    return text


def check_folder_text(option_name: str, text: str, what: str) -> None:
    """Refuse an empty folder option or one :func:`check_path_text` refuses, in one
    sentence naming ``option_name``; ``what`` says what the folder is for."""
    if not text.strip():
        raise UserError(f"{option_name} is empty; give a folder for {what}.")
    try:
        check_path_text(text)
    except ValueError as exc:
        raise UserError(f"{option_name} {exc}; give a plain folder path.") from None


def option(default: Any, help: str, **spec: Any) -> Any:
    """A dataclass field carrying its :class:`OptionSpec`."""
    return field(default=default, metadata={"option": OptionSpec(help=help, **spec)})


@dataclass(frozen=True)
class FederationOptions:
    """The first of :class:`RunConfig`'s options: the stream, the method and the federation
    it runs in (tasks, rounds, clients and how they take part). A base class only so that
    the options read in groups: field order is inherited (base fields first), and it is the
    order of ``--help`` and of ``config.json``."""

    stream: str = option(
        "rot-digits",
        "stream name (see `cfl-bench list streams`), or avalanche:package.module:factory "
        "for any Avalanche benchmark",
    )
    strategy: str = option(
        "fedavg",
        "composition, e.g. der:alpha=0.5+fedgp:gref_samples=all (see `cfl-bench list strategies`)",
        protocol=False,
    )
    model: str | None = option(None, "model name", default_text="the stream's")
    tasks: int | None = option(
        None,
        f"number of tasks (at most {MAX_TASKS:,})",
        minimum=1,
        maximum=MAX_TASKS,
        default_text="the stream's",
    )
    classes_per_task: int | None = option(
        None,
        "classes in each task of a class-incremental CIFAR stream (seq-cifar10, seq-cifar100, "
        "seq-cifar100-fot), consecutive in natural order: seq-cifar100 with 20 is 5 tasks of "
        "20 classes; without --tasks the run has ⌊classes / N⌋ tasks",
        minimum=1,
        maximum=MAX_TASKS,
        default_text="the stream's",
    )
    class_order: str = option(
        NATURAL,
        "which classes each task of a class-split stream (seq-cifar10, seq-cifar100, "
        "seq-cifar100-fot, the seq-* text streams) holds: natural (consecutive labels) or "
        "numpy:seed=N (TARGET's and LANDER's codes: the labels relabelled by "
        "np.random.seed(N)'s permutation before tasks are cut; their seed is 2023)",
        grammar=check_class_order_text,
        grammar_text="natural or numpy:seed=N",
    )
    rounds_per_task: int | None = option(
        None,
        f"communication rounds per task (a run has at most {MAX_TOTAL_ROUNDS:,} rounds in all "
        f"and {MAX_CLIENT_ROUNDS:,} client-rounds, rounds × --clients)",
        minimum=1,
        maximum=MAX_TOTAL_ROUNDS,
        default_text="the stream's",
    )
    clients: int = option(10, "number of clients K", minimum=1, maximum=100_000)
    participation: float = option(
        1.0,
        "fraction of clients per round (at least one client)",
        minimum=0,
        minimum_exclusive=True,
        maximum=1,
    )
    async_shift: int = option(
        0,
        "asynchronous task boundaries: each client's are delayed by its own seeded offset "
        "in [0, S] rounds; task t is evaluated when the last client has finished it",
        minimum=0,
        maximum=100_000,
    )
    arrivals: str | None = option(
        None,
        "clients that join over time (GLFC): glfc or glfc:initial=N,new=M,receive=F,per_round=P "
        "(defaults 30, 10, 0.9, 10): N clients at task 1, M more at every later task, a "
        "fraction F of those already there get each new task's data (the others keep their "
        "old data), P of the clients there per round; --clients must be N + (tasks-1)*M; "
        "without --partition the GLFC code's split, class-subsets (docs/protocols.md)",
        default_text="none (all clients from the start)",
    )
    task_order: str = option(
        "shared",
        "the order in which clients train the stream's tasks: shared (the stream's, for every "
        "client) or per-client[:seed=N] (FedWeIT: client k trains its own seeded permutation "
        "of the tasks; accuracy is each client's on its own tasks so far, averaged over "
        "clients; docs/protocols.md)",
        grammar=check_task_order_text,
        grammar_text="shared, per-client or per-client:seed=N",
    )
    lead_rounds: int = option(
        0,
        "extra rounds of the first task, so phases can differ in length (the CARLA highway "
        "protocol: S urban rounds, then R - S after the shift)",
        minimum=0,
        maximum=100_000,
    )


@dataclass(frozen=True)
class LocalTrainingOptions(FederationOptions):
    """:class:`RunConfig`'s options after :class:`FederationOptions`: how each client trains
    (epochs, batches, optimizer, replay buffer), how its data is split and how the server
    weights the uploads."""

    epochs: int | None = option(
        None,
        f"local epochs per round (at most {MAX_EPOCHS:,})",
        minimum=1,
        maximum=MAX_EPOCHS,
        default_text="the stream's",
    )
    batch_size: int = option(
        32, f"local batch size (at most {MAX_BATCH:,})", minimum=1, maximum=MAX_BATCH
    )
    buffer_batch_size: int | None = option(
        None,
        "examples drawn from the buffer per step (at most those stored)",
        minimum=1,
        maximum=MAX_BATCH,
        default_text="--batch-size",
    )
    lr: float | None = option(
        None,
        "local SGD learning rate",
        minimum=0,
        minimum_exclusive=True,
        maximum=1000,
        default_text="the stream's",
    )
    lr_decay: float = option(
        1.0,
        "multiply the local learning rate by this every round: round r uses lr·decay^(r-1) "
        "(FedNTD: 0.99)",
        minimum=0,
        minimum_exclusive=True,
        maximum=1,
    )
    lr_schedule: str = option(
        "run",
        "how the local learning rate moves: run (--lr-decay's lr·decay^(r-1) over the run), "
        "task-cosine (cosine from lr to --lr-end over each task's rounds, restarted at every "
        "task: LANDER's code) or task-exponential (round i of a task's R trains with "
        "lr·(lr_end/lr)^(i/R): MFCL's code)",
        choices=LR_SCHEDULES,
    )
    lr_end: float | None = option(
        None,
        "the rate a per-task --lr-schedule moves towards (LANDER's code: 1e-3, MFCL's: 0.01)",
        minimum=0,
        maximum=1000,
        default_text="none",
    )
    optimizer: str | None = option(
        None,
        "local optimizer: sgd (with --momentum) or adam (moments restarted every round)",
        choices=OPTIMIZERS,
        default_text="the stream's",
    )
    amp: str = option(
        "off",
        "mixed precision of the local steps: the forwards under bf16 or fp16 autocast "
        "(fp16 with dynamic loss scaling), losses, gradients, projections, aggregation and "
        "evaluation in fp32; fp16 needs a CUDA device (docs/executors.md)",
        choices=AMP_MODES,
    )
    momentum: float = option(
        0.0, "local SGD momentum", minimum=0, maximum=1, maximum_exclusive=True
    )
    weight_decay: float = option(0.0, "local weight decay (L2)", minimum=0, maximum=1000)
    cutout: int = option(
        0,
        "Cutout square side in pixels added to the train augmentation (FedNTD: 16); 0 is none; "
        "CIFAR-like image streams only",
        minimum=0,
        maximum=1024,
    )
    buffer_size: int = option(
        200,
        f"reservoir capacity M per client (at most {MAX_BUFFER:,})",
        minimum=1,
        maximum=MAX_BUFFER,
    )
    buffer_offer: str = option(
        "first_pass",
        "first_pass (FedGP code: each example offered once per task) | every_step (Mammoth)",
        choices=BUFFER_OFFER,
    )
    replay_augment: bool | None = option(
        None,
        "re-apply the train augmentation to replays",
        default_text="on if the stream augments",
    )
    partition: str | None = option(
        None,
        "shards | class-shards | dirichlet | iid | class-subsets, options as "
        "name:key=value,... "
        "(e.g. dirichlet:alpha=1,min_size=5)",
        default_text="the stream's; class-subsets under --arrivals",
    )
    heads: str = option(
        "shared",
        "shared: the stream's own output; per-task: one head per task (task-IL): a domain-IL "
        "stream's task t labels move to C·t.., each example trains and is scored on its "
        "task's classes only (docs/protocols.md)",
        choices=HEADS,
    )
    weighting: str = option("samples", "aggregation weights", choices=WEIGHTING)


@dataclass(frozen=True)
class RunConfig(LocalTrainingOptions):
    """One run's options. Field order is the order of ``--help`` and of ``config.json``:
    those of :class:`FederationOptions`, then :class:`LocalTrainingOptions`, then these
    (data sizes, evaluation, seed, where and how the run executes, its output)."""

    train_size: int | None = option(
        None, "use the first N training examples", minimum=1, default_text="all"
    )
    test_size: int | None = option(
        None, "use the first N test examples", minimum=1, default_text="all"
    )
    probe_size: int = option(
        500, "probe examples per task for memory drift (at most the test split)", minimum=1
    )
    eval_every_round: bool = option(
        False,
        "evaluate after every round instead of at task ends only",
        flag_off="eval-task-end",
    )
    diagnostics: bool = option(
        False,
        "measure what local training forgets, every round (needs --eval-every-round): each "
        "participant's in-local / out-local accuracy and weight divergence, the global "
        "model's class-wise forgetting (FedNTD)",
        protocol=False,
    )
    seed: int = option(0, "run seed", minimum=0, maximum=MAX_SEED, protocol=False)
    device: str = option("auto", "where to run", choices=DEVICES, protocol=False)
    threads: int | None = option(
        None,
        "CPU threads for torch; by default chosen from the model's size, the usable cores "
        "and the load: 1 for small models or a busy machine, else the free cores (recorded "
        "in config.json; a resumed run keeps its checkpoint's count)",
        minimum=1,
        maximum=256,
        protocol=False,
        default_text="automatic",
    )
    executor: str = option(
        "sequential",
        "how clients train: sequential (one after another) or vectorized (a round's clients "
        "in lock-step with torch.func; learners fedavg, er, der, derpp, agem with any "
        "component; models without BatchNorm, dropout equal on CPU) or flower (a Flower "
        "simulation, one SuperNode per client; needs pip install 'cfl-bench[flower]'; see "
        "docs/executors.md)",
        choices=EXECUTORS,
        protocol=False,
        execution=True,
    )
    clients_per_chunk: int | None = option(
        None,
        "with --executor vectorized: train a round's clients N at a time (bounds memory; "
        "on CUDA the default fits chunks to the measured memory per client)",
        minimum=1,
        maximum=100_000,
        protocol=False,
        execution=True,
        default_text="all of a round's clients (CPU), automatic (CUDA)",
    )
    compile: bool = option(
        False,
        "with --executor vectorized: torch.compile the vmapped client step (inductor; "
        "compiling takes about a minute when the run starts; see docs/executors.md for what "
        "it gained where)",
        protocol=False,
        execution=True,
    )
    channels_last: bool | None = option(
        None,
        "give the model's 2-d convolutions channels-last inputs (oneDNN/cuDNN's faster "
        "kernels: a quarter less CPU per MNIST-CNN step on one core); the convolutions then sum "
        "in another order, so records equal a contiguous run's only to rounding "
        "(docs/executors.md); sequential and flower executors",
        default_text="on for the convolutional models it makes cheaper, on CPU",
        protocol=False,
        execution=True,
    )
    data_root: str | None = option(
        None,
        "folder holding the datasets (MNIST/raw, FashionMNIST/raw, cifar-10-batches-py, "
        "cifar-100-python, text/...; see the README's Data section)",
        protocol=False,
    )
    download: bool = option(
        False,
        "fetch missing MNIST/CIFAR files with torchvision (needs network)",
        protocol=False,
    )
    out: str | None = option(
        None,
        "run directory",
        grammar=check_path_text,
        grammar_text="a folder path of UTF-8 text without control characters (newline, tab)",
        protocol=False,
        default_text="runs/<stream>_<strategy>_s<seed>-<hash>",
    )
    overwrite: bool = option(
        False,
        "replace a finished run (or another configuration's run) in --out",
        protocol=False,
    )
    restart: bool = option(
        False,
        "start an unfinished run in --out over instead of resuming it",
        protocol=False,
        execution=True,
    )
    checkpoint_every: int | None = option(
        None,
        "rounds between checkpoints; 0 = none",
        minimum=0,
        protocol=False,
        execution=True,
        default_text="every round while cheap",
    )
    keep_checkpoint: bool = option(
        False,
        "keep the last checkpoint when the run finishes",
        protocol=False,
        execution=True,
    )
    save_model: bool = option(
        False,
        "write the final global model into the run directory (model.pt, a state_dict)",
        protocol=False,
        execution=True,
    )
    log: str | None = option(
        None,
        "mirror the per-round records to experiment trackers, offline, inside the run "
        "directory: tensorboard, mlflow or tensorboard,mlflow",
        protocol=False,
        execution=True,
        default_text="none",
        grammar=parse_trackers,
        grammar_text="tensorboard, mlflow or tensorboard,mlflow",
    )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def protocol(self) -> dict[str, Any]:
        specs = option_specs()
        protocol = {k: v for k, v in self.to_dict().items() if specs[k].protocol}
        # Absent at their defaults, so the protocols of runs made before they existed keep
        # their hashes (no extra rounds and SGD is what those runs did).
        if protocol.get("classes_per_task") is None:
            protocol.pop("classes_per_task", None)
        if protocol.get("arrivals") is None:
            protocol.pop("arrivals", None)
        if not protocol.get("lead_rounds"):
            protocol.pop("lead_rounds", None)
        if protocol.get("optimizer") in (None, "sgd"):
            protocol.pop("optimizer", None)
        if protocol.get("lr_decay") == 1.0:
            protocol.pop("lr_decay", None)
        if protocol.get("lr_schedule") == "run":
            protocol.pop("lr_schedule", None)
        if protocol.get("lr_end") is None:
            protocol.pop("lr_end", None)
        if not protocol.get("cutout"):
            protocol.pop("cutout", None)
        if protocol.get("amp") == "off":
            protocol.pop("amp", None)
        if protocol.get("heads") == "shared":
            protocol.pop("heads", None)
        if protocol.get("task_order") == "shared":
            protocol.pop("task_order", None)
        if protocol.get("class_order") == NATURAL:
            protocol.pop("class_order", None)
        return protocol


@cache
def option_specs() -> dict[str, OptionSpec]:
    """Every run option's spec, in declaration order."""
    return {f.name: f.metadata["option"] for f in fields(RunConfig)}


@cache
def option_kind(name: str) -> tuple[type, bool]:
    """(base type, optional) of an option, from its annotation (``int | None`` → int, True)."""
    hint = typing.get_type_hints(RunConfig)[name]
    args = typing.get_args(hint)
    if not args:
        return hint, False
    return next(a for a in args if a is not type(None)), type(None) in args


def field_names() -> set[str]:
    return set(option_specs())


def non_protocol_names() -> frozenset[str]:
    return frozenset(k for k, s in option_specs().items() if not s.protocol)


def flag_name(name: str) -> str:
    """``rounds_per_task`` → ``--rounds-per-task``."""
    return "--" + name.replace("_", "-")


def canonical_hash(obj: object, length: int = 12) -> str:
    """Short sha256 of the canonical JSON form (sorted keys) of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


# -- checking values ------------------------------------------------------------------------
def describe_range(name: str) -> str:
    """What an option accepts, in words: "a positive integer", "a finite number in (0, 1]"."""
    spec = option_specs()[name]
    kind, _ = option_kind(name)
    if kind is bool:
        return "true or false"
    if spec.choices:
        return "one of " + ", ".join(spec.choices)
    if kind is str:
        return spec.grammar_text or "a non-empty text"
    noun = "an integer" if kind is int else "a finite number"
    low, high = spec.minimum, spec.maximum
    if kind is int and low == 1 and high is None:
        return "a positive integer"
    if low is not None and high is not None:
        left = "(" if spec.minimum_exclusive else "["
        right = ")" if spec.maximum_exclusive else "]"
        return f"{noun} in {left}{_num(low)}, {_num(high)}{right}"
    if low is not None:
        return f"{noun} {'>' if spec.minimum_exclusive else '≥'} {_num(low)}"
    return noun


def _num(value: float) -> str:
    if float(value).is_integer():
        whole = int(value)
        if whole >= 2**31 and (whole + 1).bit_count() == 1:  # 2^63 − 1 reads better as such
            return f"2^{(whole + 1).bit_length() - 1}−1"
        return str(whole)
    return str(value)


def _shown(value: object) -> str:
    """The offending value as the user wrote it, with its type when that is the problem."""
    if isinstance(value, str):
        return f"{utf8_text(quoted(value, 60))} (text)" if value else "an empty text"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, dict)):
        return f"a {'list' if isinstance(value, list) else 'mapping'} ({value!r})"[:120]
    return repr(value)


def check_value(name: str, value: object, where: str = "") -> Any:
    """``value`` if it is a valid ``name``; else a UserError naming option, value and range.

    ``where`` prefixes the message with the value's origin (e.g. "config file 'x.yaml': ").
    Integers given for float options become floats, so ``lr: 1`` and ``--lr 1`` are equal.
    """
    spec = option_specs()[name]
    kind, optional = option_kind(name)
    label = f"{where}{flag_name(name)}"
    if value is None:
        if optional:
            return None
        raise UserError(f"{label} must be {describe_range(name)}, got null; give a value.")

    def refuse() -> UserError:
        return UserError(f"{label} must be {describe_range(name)}, got {_shown(value)}.")

    if kind is bool:
        if not isinstance(value, bool):
            raise refuse()
        return value
    if kind is str:
        if not isinstance(value, str) or not value.strip():
            what = describe_range(name) if spec.choices else "a non-empty text"
            raise UserError(f"{label} must be {what}, got {_shown(value)}.")
        if spec.choices and value not in spec.choices:
            raise refuse()
        if spec.grammar is not None:
            try:
                spec.grammar(value)
            except ValueError:
                raise refuse() from None
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise refuse()
    if kind is int and not isinstance(value, int):
        raise refuse()
    if kind is float:
        if not math.isfinite(value):
            raise refuse()
        value = float(value)
    if not _in_range(spec, value):
        raise refuse()
    return value


def _in_range(spec: OptionSpec, value: float) -> bool:
    if spec.minimum is not None and (
        value < spec.minimum or (spec.minimum_exclusive and value == spec.minimum)
    ):
        return False
    return spec.maximum is None or not (
        value > spec.maximum or (spec.maximum_exclusive and value == spec.maximum)
    )


def parse_text(name: str, raw: str, where: str = "", allow_null: bool = False) -> Any:
    """A value given as text (command line, sweep ``--set``) turned into the option's type.

    Numbers must look like numbers (no ``inf``, ``nan``, ``1_000`` or hex); booleans are
    ``true``/``false``; with ``allow_null`` the words none/null give "not set" (sweeps).
    """
    kind, optional = option_kind(name)
    text = raw.strip()
    label = f"{where}{flag_name(name)}"
    if allow_null and optional and text.lower() in NULL_WORDS:
        return None
    value: object = raw
    if kind is bool:
        if text.lower() not in ("true", "false"):
            raise UserError(f"{label} must be true or false, got '{raw}'.")
        value = text.lower() == "true"
    elif kind is int:
        if not INT_TEXT.fullmatch(text) or len(text) > _MAX_NUMBER_TEXT:
            raise UserError(f"{label} must be {describe_range(name)}, got {quoted(raw)}.")
        value = int(text)
    elif kind is float:
        if not FLOAT_TEXT.fullmatch(text):
            raise UserError(f"{label} must be {describe_range(name)}, got '{raw}'.")
        value = float(text)
    return check_value(name, value, where)


# -- YAML -----------------------------------------------------------------------------------
def read_yaml_mapping(path: str | Path, kind: str, shape: str) -> dict[Any, Any]:
    """The mapping in YAML file ``path``; ``kind`` names the file in errors ("config file"),
    ``shape`` says what the mapping must hold. Non-UTF-8 or binary files and duplicate keys
    are refused: a key given twice would otherwise silently keep its last value."""
    import yaml

    p = Path(path)
    if p.is_dir():
        raise UserError(f"{kind} '{p}' is a directory, not a file; pass the path of a YAML file.")
    if p.exists() and not p.is_file():
        raise UserError(f"{kind} '{p}' is {path_kind(p)}, not a file; pass a YAML file.")
    if not p.is_file():
        raise UserError(f"{kind} '{p}' does not exist; pass the path of a YAML file.")
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise UserError(f"{kind} '{p}' cannot be read ({exc.strerror}); check it.") from None
    if b"\x00" in raw:
        raise UserError(f"{kind} '{p}' is a binary file, not YAML; pass a YAML text file.")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(
            f"{kind} '{p}' is not UTF-8 text (byte {exc.start}); save it as UTF-8."
        ) from None
    try:
        data = load_plain_yaml(text) or {}
    except YamlFormError as exc:
        raise UserError(f"{kind} '{p}': {exc}") from None
    except _DuplicateKeyError as exc:
        raise UserError(f"{kind} '{p}' gives key '{exc.key}' twice; keep one.") from None
    except yaml.constructor.ConstructorError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        if "unhashable" in str(exc.problem):
            raise UserError(
                f"{kind} '{p}' has a list or mapping as a key{at}; keys are option names."
            ) from None
        raise UserError(
            f"{kind} '{p}' uses a YAML tag this reader does not accept{at} (e.g. !!python); "
            f"write plain values."
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise UserError(
            f"{kind} '{p}' is not valid YAML{at} ({exc.__class__.__name__}); fix its syntax."
        ) from None
    if not isinstance(data, dict):
        raise UserError(f"{kind} '{p}' must be a mapping {shape}.")
    return data


def load_plain_yaml(text: str) -> Any:
    """The document in ``text``, read so that it means the same under YAML 1.1 and 1.2.

    Why: PyYAML reads YAML 1.1, where ``017`` is octal 15, ``1:30`` is 90 (base 60),
    ``0x10`` is 16 and ``yes``/``on`` are booleans; YAML 1.2 (and most other tools) read
    17, the text "1:30" and the text "yes". A seed or a grid ``[07, 010]`` must never run
    a value the user did not write, so every plain scalar whose two readings differ, and
    every non-decimal integer, is refused (:func:`check_plain_scalars`) — except a decimal
    with an exponent (``1e-3``), text to 1.1 and a number to 1.2, read as that number. Aliases are
    refused while composing, before anything is expanded: nested aliases ("billion laughs")
    expand a few hundred bytes into billions of values.
    """
    loader = _strict_loader()(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        check_plain_scalars(node, loader)
        return loader.construct_document(node)
    finally:
        loader.dispose()


class YamlFormError(Exception):
    """A YAML form this reader refuses; the message is the rest of a one-line sentence."""


_YAML12_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
_DECIMAL_INT = re.compile(r"[-+]?[0-9]+")
# A decimal number with an exponent and no leading zero before other digits: 1e-3, 2.5E4.
_EXPONENT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)(?:\.[0-9]*)?[eE][-+]?[0-9]+")
_RADIX_NAMES = {"x": "hexadecimal", "o": "octal", "b": "binary"}
_MAX_NUMBER_TEXT = 400  # longer numbers are outside every option's range anyway


def yaml12_reading(text: str) -> object:
    """What YAML 1.2's core schema makes of the plain scalar ``text``."""
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if len(text) > _MAX_NUMBER_TEXT:
        return text
    if _DECIMAL_INT.fullmatch(text):
        return int(text)
    if re.fullmatch(r"0o[0-7]+", text):
        return int(text[2:], 8)
    if re.fullmatch(r"0x[0-9a-fA-F]+", text):
        return int(text[2:], 16)
    if _YAML12_FLOAT.fullmatch(text):
        return float(text)
    if re.fullmatch(r"[-+]?\.(?:inf|Inf|INF)", text):
        return -math.inf if text.startswith("-") else math.inf
    if re.fullmatch(r"\.(?:nan|NaN|NAN)", text):
        return math.nan
    return text


def _same_reading(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


def _reading_text(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"the text '{value}'"
    if isinstance(value, (int, float)):
        return repr(value)
    return "null" if value is None else f"a {type(value).__name__}"


def _fix_for(*readings: object) -> str:
    """How to write what the user meant, given the two readings of a plain scalar."""
    if any(isinstance(r, bool) for r in readings):
        return "write true or false, or quote it if it is text"
    if any(isinstance(r, (int, float)) for r in readings):
        return (
            "write the number in plain decimal (no leading zero, '_' or ':'), or quote it if "
            "it is text"
        )
    return "quote it if it is text"


def check_plain_scalars(node: Any, loader: Any, key: str = "") -> None:
    """Refuse (:class:`YamlFormError`) a plain scalar read differently by YAML 1.1 and 1.2,
    or an integer written in hexadecimal, octal or binary; ``key`` is the nearest mapping
    key, for the message. Quoted scalars are text in both and always pass."""
    import yaml

    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            check_plain_scalars(key_node, loader, key)
            name = key_node.value if isinstance(key_node, yaml.ScalarNode) else key
            check_plain_scalars(value_node, loader, str(name))
        return
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            check_plain_scalars(item, loader, key)
        return
    text = node.value
    if node.style is not None or loader.resolve(yaml.ScalarNode, text, (True, False)) != node.tag:
        return  # quoted, or tagged explicitly (!!str 017)
    line = node.start_mark.line + 1
    if len(text) > _MAX_NUMBER_TEXT and node.tag.endswith((":int", ":float")):
        raise YamlFormError(
            f"{key + ': ' if key else ''}a number of {len(text)} characters (line {line}) is "
            f"outside every option's range; write a smaller number."
        )
    yaml11 = loader.construct_object(node)
    yaml12 = yaml12_reading(text)
    where = f"{key + ': ' if key else ''}{text} (line {line})"
    if isinstance(yaml11, str) and isinstance(yaml12, float) and _EXPONENT.fullmatch(text):
        # 1e-3 is text to YAML 1.1 (its floats need a dot) and 0.001 to YAML 1.2: nothing
        # else can be meant, so the 1.2 reading is taken (lr: 1e-3 is how configs write it).
        loader.constructed_objects.pop(node, None)
        node.tag = "tag:yaml.org,2002:float"
        return
    if not _same_reading(yaml11, yaml12):
        raise YamlFormError(
            f"{where} reads as {_reading_text(yaml11)} in YAML 1.1 but as "
            f"{_reading_text(yaml12)} in YAML 1.2; {_fix_for(yaml11, yaml12)}."
        )
    radix = re.match(r"[-+]?0([xob])", text)
    if isinstance(yaml11, int) and not isinstance(yaml11, bool) and radix:
        raise YamlFormError(
            f"{where} is a {_RADIX_NAMES[radix.group(1)]} integer ({yaml11}); write it in "
            f"plain decimal."
        )


class _DuplicateKeyError(Exception):
    def __init__(self, key: object) -> None:
        super().__init__(key)
        self.key = key


#: How deep lists and mappings may nest in a YAML file. Why: PyYAML composes (and this
#: module checks) nested nodes by recursion, so '[' * 5000 ended in a RecursionError
#: traceback; the deepest shipped file (a reproduction table) nests 4 levels.
MAX_YAML_DEPTH = 32


@cache
def _strict_loader() -> type:
    """A SafeLoader that refuses duplicate mapping keys, aliases and nesting deeper than
    ``MAX_YAML_DEPTH``, each before the node is composed."""
    import yaml

    class StrictLoader(yaml.SafeLoader):
        depth = 0  # how many lists and mappings enclose the node being composed

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                event = self.peek_event()
                raise YamlFormError(
                    f"line {event.start_mark.line + 1} uses the alias *{event.anchor}; aliases "
                    f"(and merge keys <<) are not read, since nested aliases can expand a small "
                    f"file into billions of values: write each value out."
                )
            depth = self.depth
            if depth >= MAX_YAML_DEPTH:
                line = self.peek_event().start_mark.line + 1
                raise YamlFormError(
                    f"line {line} nests lists or mappings more than {MAX_YAML_DEPTH} levels "
                    f"deep; a config needs a few levels at most: write it flatter."
                )
            self.depth = depth + 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth = depth

        def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
            seen: set[object] = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, typing.Hashable):
                    continue  # a list as a key: SafeConstructor refuses it below
                if key in seen:
                    raise _DuplicateKeyError(key)
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def normalise_key(raw: object) -> str:
    return str(raw).replace("-", "_")


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read a YAML config whose keys are run options (dashes or underscores), type-checked."""
    p = Path(path)
    data = read_yaml_mapping(p, "config file", "of option names to values")
    values: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = normalise_key(raw_key)
        if key not in option_specs():
            raise UserError(
                f"config file '{p}' has unknown key '{raw_key}'; valid keys are the "
                f"`cfl-bench run` options (see `cfl-bench run --help`)."
            )
        if key in values:
            raise UserError(f"config file '{p}' gives '{key}' twice (two spellings); keep one.")
        values[key] = check_value(key, value, f"config file '{p}': ")
    return values


# -- building a config ----------------------------------------------------------------------
def make_config(overrides: Mapping[str, Any], yaml_path: str | None = None) -> RunConfig:
    """Defaults, then the YAML file, then explicit CLI values (None = not given).

    CLI values may be text (parsed strictly) or already typed (boolean flags, Python callers).
    """
    values: dict[str, Any] = {}
    if yaml_path:
        values.update(load_yaml(yaml_path))
    for key, value in overrides.items():
        if value is None:
            continue
        if key not in option_specs():
            raise UserError(f"unknown option '{key}'; see `cfl-bench run --help`.")
        values[key] = (
            parse_text(key, value)
            if isinstance(value, str) and option_kind(key)[0] is not str
            else check_value(key, value)
        )
    config = RunConfig(**values)
    validate(config)
    return config


def validate(config: RunConfig) -> None:
    """Check every option's type and range, then the relations between options."""
    for name in option_specs():
        check_value(name, getattr(config, name))
