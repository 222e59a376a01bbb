"""The declaration table: every registered component's name, summary, paper, roles,
payloads, places in the step and server orders, and typed options — importable without
torch.

Why a table apart from the component modules: the grammar (``strategies.compose``), the
listing (``cfl-bench list strategies``), the run's canonical name and ``cfl-bench run``'s
early refusals read only these declarations, so a misspelled strategy is refused at once
while the modules that compute import torch at their top like any module. A component
class takes its row (``declaration = declarations.FEDGP``), so nothing here is written twice;
``strategies.registry`` imports a row's ``target`` only when a run builds the strategy.

Each ``…Options`` is a frozen dataclass: a field per option, its annotation the parsed
value's type, its ``option(...)`` the default, help, parser and choices. The values are
exactly those the runs record (config.json, the protocol hash): a default keeps its
written type (``1`` stays an int, ``'task'`` a word the parser would turn into None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from cfl_bench.core.payloads import Payload
from cfl_bench.core.text_values import (
    boolean,
    finite_float,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    unit_fraction,
)
from cfl_bench.strategies.base import Declaration, Role, option, text

# (cifar100 last: the refusal listing the choices keeps its earlier wording as a prefix)
PUBLIC_CHOICES = ("auto", "fashion-mnist", "holdout", "cifar100")
# The size option every public-set user declares (FedProj, FedDF): one text, one parser.
PUBLIC_SIZE_HELP = (
    "public examples: subset of the named dataset (auto: 1000), or withheld per task "
    "(auto: 10% of the task's training examples, at most 1000)"
)


def gref_samples(raw: str) -> int | str:
    """``all`` (any case: the whole buffer, the authors' setting) or a positive sample count;
    the refusal names both forms, not just the integer one."""
    if raw.lower() == "all":
        return "all"
    try:
        return positive_int(raw)
    except ValueError:
        raise ValueError("must be a positive integer or 'all'") from None


def generation_length(raw: str) -> int | None:
    """Rounds per generation, or ``task``/``auto`` (any case: None = one task's rounds); the
    refusal names every accepted form, not just the integer one."""
    if raw.lower() in ("task", "auto"):
        return None
    try:
        return positive_int(raw)
    except ValueError:
        raise ValueError("must be a positive integer, 'task' or 'auto'") from None


def _generation_shown(value: object) -> str:
    return "task" if value is None else str(value)


def decay(raw: str) -> float:
    """A momentum or moment decay: finite, in [0, 1) (1 would never forget)."""
    must = "must be a number in [0, 1)"
    value = finite_float(raw, must, bounded=True)
    if not 0 <= value < 1:
        raise ValueError(must)
    return value


@dataclass(frozen=True)
class DEROptions:
    """``der:…`` options."""

    alpha: float | None = option(
        None,
        "weight of the logit-matching term (default 1.0 MNIST-like, 0.3 otherwise)",
        non_negative_float,
    )


@dataclass(frozen=True)
class DERPPOptions:
    """``derpp:…`` options."""

    alpha: float = option(0.1, "weight of the logit-matching (MSE) term", non_negative_float)
    beta: float = option(0.5, "weight of the label-replay (CE) term", non_negative_float)


@dataclass(frozen=True)
class AGEMOptions:
    """``agem:…`` options."""

    agem_fill: Literal["reservoir", "task_end"] = option(
        "reservoir",
        "buffer filling: reservoir during training (FedGP code) or M/T per task at task end",
        text,
        choices=("reservoir", "task_end"),
    )


@dataclass(frozen=True)
class FedProxOptions:
    """``fedprox:…`` options."""

    mu: float = option(0.01, "proximal weight μ (FedNTD's code used 1.0)", non_negative_float)


@dataclass(frozen=True)
class FedCurvOptions:
    """``fedcurv:…`` options."""

    lam: float = option(1.0, "penalty weight λ", non_negative_float)
    samples: int = option(500, "examples used for each client's Fisher", positive_int)


@dataclass(frozen=True)
class FedNTDOptions:
    """``fedntd:…`` options."""

    tau: float = option(1.0, "distillation temperature τ", positive_float)
    beta: float = option(1.0, "weight β of the not-true distillation term", non_negative_float)


@dataclass(frozen=True)
class MOONOptions:
    """``moon:…`` options."""

    mu: float = option(
        0.1,
        "weight μ of the contrastive term (FedNTD's config; the paper used 5 on CIFAR-10)",
        non_negative_float,
    )
    tau: float = option(0.5, "temperature τ of the contrastive term", positive_float)


@dataclass(frozen=True)
class LwFOptions:
    """``lwf:…`` options."""

    weight: float = option(
        1.0, "weight λ of the distillation term (the paper's λ_o)", non_negative_float
    )
    temperature: float = option(2.0, "temperature T of both softmaxes", positive_float)


@dataclass(frozen=True)
class ICaRLOptions:
    """``icarl:…`` options (defaults: the federated iCaRL of TARGET's code base)."""

    memory: int = option(
        2000,
        (
            "exemplars each client keeps (the code's memory_size: main.py's 300 is "
            "overwritten to 2000 by its BaseLearner)"
        ),
        positive_int,
    )
    selection: Literal["random", "herding"] = option(
        "random",
        (
            "exemplars: a uniform draw of the memory from all the client's earlier data "
            "(code) or herding of memory/classes-seen per class (paper)"
        ),
        text,
        choices=("random", "herding"),
    )
    loss: Literal["softmax", "sigmoid"] = option(
        "softmax",
        (
            "CE + softmax KD on the old classes (code) or binary CE over the classes seen, "
            "old ones against the old model's sigmoid (paper)"
        ),
        text,
        choices=("softmax", "sigmoid"),
    )
    temperature: float = option(
        2.0, "temperature T of the old-class distillation (code: 2)", positive_float
    )
    weight: float = option(1.0, "weight of the distillation term (code: 1)", non_negative_float)
    classifier: Literal["cnn", "nme"] = option(
        "cnn",
        (
            "evaluation: the model's outputs (code, its tables) or the nearest mean of "
            "exemplars, class means federated from the clients (paper; needs herding)"
        ),
        text,
        choices=("cnn", "nme"),
    )


@dataclass(frozen=True)
class TARGETOptions:
    """``target:…`` options (defaults: TARGET's official code, zj-jayzhang/
    Federated-Class-Continual-Learning; methods/target.py and main.py line numbers)."""

    kd: float = option(
        25.0,
        "weight of the old model's distillation on synthetic images (main.py:87: 25)",
        non_negative_float,
    )
    temperature: float = option(
        2.0, "temperature T of the clients' distillation (target.py:716: 2)", positive_float
    )
    nums: int = option(
        8000,
        "synthetic images the clients read at most, the first in the code's sorted file "
        "names (main.py:86: 8000; the code's schedule makes only 2,560)",
        positive_int,
    )
    syn_round: int = option(
        10,
        "synthesis rounds per task end (target.py:40: 10, the CIFAR-100 constants)",
        positive_int,
    )
    g_steps: int = option(
        10, "generator steps per synthesis round (target.py:26: 10)", positive_int
    )
    synthesis_batch_size: int = option(
        256, "images per synthesis round (target.py:24: 256)", positive_int
    )
    warmup: int = option(
        20,
        "synthesis rounds before the adversarial term and the KD student run (target.py:29: "
        "20, more than syn_round: the code never runs them)",
        non_negative_int,
    )
    kd_steps: int = option(
        400,
        "KD student steps per synthesis round after warmup (target.py:28: 400)",
        positive_int,
    )
    synthetic_batch: int = option(
        0,
        "synthetic images per client step; 0 = the code's ⌊nums / ⌈50000 / (clients · tasks "
        "· batch size)⌉⌋ (target.py:616–624: 500 at its defaults)",
        non_negative_int,
    )


@dataclass(frozen=True)
class LANDEROptions:
    """``lander:…`` options (defaults: LANDER's official code, tmtuan1307/LANDER;
    main.py and methods/lander.py line numbers)."""

    anchors: str = option(
        "minilm",
        "label-text-embedding anchors: minilm (the suite's MiniLM encoder on the class "
        "names; the code loads CLIP vectors it ships without a licence) or the PATH of a "
        "torch.save'd tensor of classes × dim, rows in the data's own label order (under "
        "--class-order both are permuted as the labels are)",
        text,
    )
    ltc: float = option(
        5.0, "weight of the bounding loss around the anchors (main.py:109: 5)", non_negative_float
    )
    r: float = option(0.015, "radius of the bounding loss (main.py:108: 0.015)", non_negative_float)
    cur: float = option(
        0.2,
        "base weight of the current task's loss, alpha_cur (main.py:111: 0.2)",
        non_negative_float,
    )
    pre: float = option(
        0.4,
        "base weight of the old tasks' distillation, alpha_pre (main.py:110: 0.4)",
        non_negative_float,
    )
    tau: float = option(
        2.0, "temperature of the clients' distillation (lander.py:23: 2)", positive_float
    )
    syn_bs: int = option(
        1,
        "synthetic images per client step, in local batches (main.py:104: 1, lander.py:633)",
        positive_int,
    )
    nums: int = option(
        10000,
        "synthetic images kept, the first in the code's sorted file names (main.py:95: 10000)",
        positive_int,
    )
    syn_round: int = option(
        40, "synthesis rounds per task end after the warm-up (main.py:97: 40)", positive_int
    )
    warmup: int = option(
        10,
        "synthesis rounds before images are kept (main.py:96: 10; the adversarial term "
        "starts at round warmup + 3, lander.py:301, 360)",
        non_negative_int,
    )
    g_steps: int = option(40, "generator steps per synthesis round (main.py:98: 40)", positive_int)
    synthesis_batch_size: int = option(
        256, "images per synthesis round (main.py:90: 256)", positive_int
    )
    kd_steps: int = option(
        50, "KD student steps per kept synthesis round (lander.py:25: 50)", positive_int
    )
    best_model: bool = option(
        True,
        "at each task's end, restore the round-start global model whose round's clients "
        "summed the lowest first-epoch loss (lander.py:748-771); false keeps the last average",
        boolean,
    )


@dataclass(frozen=True)
class MFCLOptions:
    """``mfcl:…`` options (defaults: MFCL's official code, SaraBabakN/MFCL-NeurIPS23;
    ``utiles.py`` lines of its argument parser)."""

    syn_size: int = option(
        128, "synthetic images a client generates per local step (utiles.py:91: 128)", positive_int
    )
    w_kd: float = option(
        0.1,
        "weight of the old head's feature distillation on the joint batch (utiles.py:102: 1e-1)",
        non_negative_float,
    )
    w_ft: float = option(
        1.0,
        "weight of the head's CE on every row's detached features (utiles.py:103: 1)",
        non_negative_float,
    )
    server_ss: int = option(
        128, "images per generator training step (utiles.py:92: 128)", positive_int
    )
    pi: int = option(
        100, "generator training steps at each task end (utiles.py:93: 100)", positive_int
    )
    generator_lr: float = option(
        0.001, "Adam learning rate of the generator (utiles.py:94: 0.001)", positive_float
    )
    z_dim: int = option(1000, "noise dimension of the generator (utiles.py:95: 1000)", positive_int)
    w_ie: float = option(
        1.0,
        "weight of the information-entropy term; 0 = the code's ie_loss=0 (utiles.py:101, 97)",
        non_negative_float,
    )
    w_bn: float = option(
        50.0,
        "weight of the BatchNorm-statistics term; 0 = bn_loss=0 (utiles.py:106: 5e1, 99)",
        non_negative_float,
    )
    w_noise: float = option(
        0.001,
        "weight of the image-smoothness prior; 0 = noise=0 (utiles.py:105: 1e-3, 100)",
        non_negative_float,
    )


@dataclass(frozen=True)
class GLFCOptions:
    """``glfc:…`` options (defaults: GLFC's official code, conditionWang/FCIL)."""

    memory: int = option(
        2000,
        "exemplars each client keeps, split evenly over the classes it has learned (code: 2000)",
        positive_int,
    )
    gc_weight: float = option(
        0.5,
        "weight of the gradient compensation loss L_GC once there is an old model (code: 0.5)",
        non_negative_float,
    )
    rd_weight: float = option(
        0.5,
        "weight of the relation distillation loss L_RD once there is an old model (code: 0.5)",
        non_negative_float,
    )
    proxy: Literal["code", "none"] = option(
        "code",
        "the old model: code = the proxy server's best global model on gradient-inverted "
        "prototypes (best_2 in a client's first round of a task, best_1 after); none = the "
        "global model the client received when it entered its task (no proxy server)",
        text,
        choices=("code", "none"),
    )
    inversion_iterations: int = option(
        250,
        "L-BFGS steps of the proxy server's gradient inversion, the last 20 kept (code: 250)",
        positive_int,
    )


@dataclass(frozen=True)
class OnlineEWCOptions:
    """``ewc:…`` options."""

    lam: float = option(100.0, "penalty weight λ", non_negative_float)
    gamma: float = option(1.0, "decay γ of the running Fisher (1: no decay)", unit_fraction)
    samples: int = option(256, "examples for each client's Fisher", positive_int)


@dataclass(frozen=True)
class FedProjOptions:
    """``fedproj:…`` options."""

    public: str = option(
        "auto",
        (
            "public data: fashion-mnist, holdout (training inputs no client holds), or auto "
            "(fashion-mnist for 1×28×28 streams, else holdout)"
        ),
        text,
        choices=PUBLIC_CHOICES,
    )
    public_size: int | None = option(None, PUBLIC_SIZE_HELP, positive_int)
    temperature: float = option(3.0, "distillation temperature T", positive_float)
    gamma: float = option(0.0, "weight γ of ‖θ − θ_avg‖² during distillation", non_negative_float)
    distill_epochs: int = option(1, "server distillation epochs per round", positive_int)
    distill_lr: float = option(0.0001, "server Adam learning rate", positive_float)
    eps: float = option(1e-08, "no client projection when ‖g_glob‖² ≤ eps", non_negative_float)
    memory_temperature: Literal["T", "1"] = option(
        "T",
        (
            "client memory loss at temperature T (T) or without it (1: the papers' form; T stays "
            "on the server)"
        ),
        text,
        choices=("T", "1"),
        quiet_default=True,
    )
    memory: Literal["batch", "all"] = option(
        "batch",
        (
            "g_glob on a random memory batch of the buffer batch size (batch) or on the whole "
            "memory at every step (all: the papers' L_mem; |M|/batch times the cost)"
        ),
        text,
        choices=("batch", "all"),
        quiet_default=True,
    )
    warmup_epochs: int = option(
        0,
        (
            "epochs of server cross-entropy on the labelled holdout before round 1 (the first "
            "paper's round 0; needs public=holdout)"
        ),
        non_negative_int,
        quiet_default=True,
    )
    anchor: Literal["snapshot", "mean", "global"] = option(
        "snapshot",
        (
            "γ's anchor: snapshot (the FedAvg mean θ_avg), mean (unweighted client mean: the "
            "paper's), global (previous θ_g); needs gamma > 0"
        ),
        text,
        choices=("snapshot", "mean", "global"),
        quiet_default=True,
    )


@dataclass(frozen=True)
class FedGPOptions:
    """``fedgp:…`` options."""

    gref_samples: int | Literal["all"] = option(
        32, "buffer samples per client for g_ref (int or 'all')", gref_samples
    )
    gref_mode: Literal["train", "eval"] = option(
        "train",
        "model mode while computing g_ref (train = authors' code)",
        text,
        choices=("train", "eval"),
    )
    gref_interval: int = option(
        1, "recompute g_ref every k rounds (stale in between)", positive_int
    )
    equal_comm: bool = option(False, "halve the rounds per task, double local epochs", boolean)


def below_one(raw: str) -> float:
    """A fraction that may be 0 but not 1 (FedWeIT's ``client_sparsity`` indexes the sorted
    masks at ⌊n·s⌋, which must be an entry)."""
    must = "must be a fraction in [0, 1)"
    value = finite_float(raw, must, bounded=True)
    if not 0 <= value < 1:
        raise ValueError(must)
    return value


@dataclass(frozen=True)
class FedWeITOptions:
    """``fedweit:…`` options (defaults: the official code's ``config.py``)."""

    lambda_l1: float = option(
        1e-3,
        "λ1: L1 weight on the task-adaptive A, and the hard threshold |A| > λ1 that prunes A at "
        "evaluation and in the knowledge base (code: 1e-3)",
        non_negative_float,
    )
    lambda_l2: float = option(
        100.0,
        "λ2: weight of the retroactive term on past tasks' B⊙σ(m_i)+A_i (code: 100)",
        non_negative_float,
    )
    lambda_mask: float = option(
        0.0,
        "L1 weight on the mask m, and its evaluation threshold on σ(m) (code: 0)",
        non_negative_float,
    )
    wd: float = option(
        1e-4,
        "weight decay ½‖·‖² on A and m, and on B in the first task (code: 1e-4)",
        non_negative_float,
    )
    client_sparsity: float = option(
        0.3,
        "fraction of each layer's output channels (smallest |m|) whose base B is not sent up "
        "(code: 0.3)",
        below_one,
    )
    sparse_comm: bool = option(True, "send B pruned by the mask, aggregate per channel", boolean)
    mask_grad: Literal["round", "step"] = option(
        "round",
        "round = the code: the forward uses σ(m) taken at the round start, so only the decay "
        "moves m; step = the paper: the loss trains m through σ(m)",
        text,
        choices=("round", "step"),
    )
    kb_self: Literal["keep", "drop"] = option(
        "keep",
        "keep = the code: every client gets all K clients' A (its own too); drop = the paper: "
        "its own column is zeroed",
        text,
        choices=("keep", "drop"),
    )


@dataclass(frozen=True)
class FOTOptions:
    """``fot:…`` options (defaults: the official code's permuted-MNIST IID command)."""

    epsilon: float = option(
        0.96, "energy threshold ε of the task-end subspace (code: 0.96 PMNIST IID)", unit_fraction
    )
    eps_inc: float = option(
        0.0, "added to ε after every task end (code: 0.0 PMNIST, 0.001 CIFAR)", non_negative_float
    )
    act_mode: Literal["auto", "train", "eval"] = option(
        "auto",
        "model mode while clients record activations: auto = the code's trainer for the "
        "model (train for Linear-only models: MLP trainer; eval with convolutions: CIFAR "
        "trainer)",
        text,
        choices=("auto", "train", "eval"),
    )
    sketch: Literal["auto", "uniform", "gaussian"] = option(
        "auto",
        "clients' random sketch matrix: uniform = U[-1, 1], d wide (MLP trainer); gaussian = "
        "N(0, 1), d wide for conv and 5·d for Linear layers (CIFAR trainer); auto = the "
        "model's trainer (gaussian with convolutions)",
        text,
        choices=("auto", "uniform", "gaussian"),
    )
    last_layer: Literal["auto", "project", "free"] = option(
        "auto",
        "the output layer: auto = free on task-IL streams (the code's AlexNet heads), "
        "projected otherwise (the code's MLP)",
        text,
        choices=("auto", "project", "free"),
    )


@dataclass(frozen=True)
class IFAOptions:
    """``ifa:…`` options."""

    mode: Literal["later", "random"] = option(
        "later",
        "later = last layers by parameter count; random = random scalars",
        text,
        choices=("later", "random"),
    )
    rho: float = option(0.2, "fraction of the parameters to reset", unit_fraction)
    generation: int | Literal["task"] | None = option(
        "task",
        "rounds per generation ('task' = the rounds of one task)",
        generation_length,
        show=_generation_shown,
    )
    generations: int = option(
        0,
        "split the run's rounds into N equal generations (0: use generation)",
        non_negative_int,
        quiet_default=True,
    )
    later_unit: Literal["params", "layers"] = option(
        "params",
        (
            "mode=later: params = the suffix of whole layers nearest ρ·P parameters; layers = "
            "the last round(ρ·L) of the L weight layers (the paper)"
        ),
        text,
        choices=("params", "layers"),
        quiet_default=True,
    )
    reset_to: Literal["generation_start", "init"] = option(
        "generation_start",
        "reset to the generation's starting values or to the initial ones",
        text,
        choices=("generation_start", "init"),
    )


@dataclass(frozen=True)
class FedDynOptions:
    """``feddyn:…`` options."""

    alpha: float = option(
        0.1,
        "regularisation weight α (FedNTD's config; the paper used 0.1, 0.01, 0.001)",
        positive_float,
    )
    mean: Literal["uniform", "weighted"] = option(
        "uniform",
        (
            "uniform = the paper's 1/|S| mean of the uploads; weighted = the engine's "
            "--weighting mean (FedNTD's code: by samples)"
        ),
        text,
        choices=("uniform", "weighted"),
    )


@dataclass(frozen=True)
class ScaffoldOptions:
    """``scaffold:…`` options."""

    variate: Literal["II", "I"] = option(
        "II",
        (
            "II = c_k − c + (θ_g − θ_k)/(K·η) (the paper's cheaper option); I = the local "
            "gradient at θ_g (one extra pass over the client's data)"
        ),
        text,
        choices=("II", "I"),
    )
    server_lr: float = option(
        1.0,
        "server step η_g: θ_g ← θ_old + η_g·(θ_avg − θ_old) (1 = FedAvg's mean)",
        positive_float,
    )
    divisor: Literal["steps", "momentum"] = option(
        "momentum",
        (
            "option II's divisor: momentum = FedNova's momentum-corrected step count a_K times η "
            "(FedNTD's adaptive division; K·η without momentum, the paper's); steps = K·η even "
            "under momentum"
        ),
        text,
        choices=("steps", "momentum"),
    )


@dataclass(frozen=True)
class FedAvgMOptions:
    """``fedavgm:…`` options."""

    momentum: float = option(0.7, "server momentum β (FedNTD's config/fedavgm.json)", decay)
    server_lr: float = option(1.0, "server learning rate η_s (FedNTD's code: 1)", positive_float)


@dataclass(frozen=True)
class FedOptOptions:
    """``fedopt:…`` options."""

    server_opt: Literal["adam", "yogi", "adagrad"] = option(
        "adam",
        "the server optimizer: adam, yogi or adagrad",
        text,
        choices=("adam", "yogi", "adagrad"),
    )
    server_lr: float | None = option(
        None,
        (
            "server learning rate η; auto = the paper's best on CIFAR-10 (adam, yogi 0.01; "
            "adagrad 0.1)"
        ),
        positive_float,
    )
    beta1: float = option(0.9, "first-moment decay β1 (the paper's)", decay)
    beta2: float = option(0.99, "second-moment decay β2 (the paper's)", decay)
    tau: float = option(0.001, "adaptivity τ (the paper's)", positive_float)


@dataclass(frozen=True)
class FedDFOptions:
    """``feddf:…`` options."""

    public: str = option(
        "auto",
        (
            "public data: cifar100 (CIFAR-100 train, 3×32×32 streams; the paper's for CIFAR-10), "
            "fashion-mnist (1×28×28), holdout (training inputs no client holds), or auto "
            "(fashion-mnist for 1×28×28 streams, else holdout)"
        ),
        text,
        choices=PUBLIC_CHOICES,
    )
    public_size: int | None = option(None, PUBLIC_SIZE_HELP, positive_int)
    temperature: float = option(
        1.0, "distillation temperature T (authors' code: 1)", positive_float
    )
    distill_steps: int = option(
        500,
        (
            "server Adam steps per round, cosine-annealed (authors: up to 10⁴ with early "
            "stopping on validation data, which this server lacks)"
        ),
        positive_int,
    )
    distill_lr: float = option(0.001, "server Adam learning rate (authors' code)", positive_float)


# -- the table --------------------------------------------------------------------------

FEDAVG = Declaration(
    name="fedavg",
    target="cfl_bench.strategies.fedavg:FedAvg",
    summary="plain local SGD on the current task; FedAvg aggregation (lower bound)",
    paper="McMahan et al., AISTATS 2017",
    roles=frozenset({Role.LEARNER}),
)

ER = Declaration(
    name="er",
    target="cfl_bench.strategies.er:ER",
    summary="CE on the batch + CE on a reservoir buffer draw",
    paper="Chaudhry et al., 2019 (tiny episodic memories, reservoir ER)",
    roles=frozenset({Role.LEARNER}),
)

DER = Declaration(
    name="der",
    target="cfl_bench.strategies.der:DER",
    summary="CE + α·MSE between current and stored logits on buffer samples",
    paper="Buzzega et al., NeurIPS 2020 (DER)",
    roles=frozenset({Role.LEARNER}),
    options=DEROptions,
)

DERPP = Declaration(
    name="derpp",
    target="cfl_bench.strategies.derpp:DERPP",
    summary="DER + β·CE on the labels of a second, independent buffer draw",
    paper="Buzzega et al., NeurIPS 2020 (DER++)",
    roles=frozenset({Role.LEARNER}),
    options=DERPPOptions,
)

AGEM = Declaration(
    name="agem",
    target="cfl_bench.strategies.agem:AGEM",
    summary="project the batch gradient when it conflicts with the buffer gradient",
    paper="Chaudhry et al., ICLR 2019 (A-GEM)",
    roles=frozenset({Role.LEARNER}),
    options=AGEMOptions,
)

IDEAL = Declaration(
    name="ideal",
    target="cfl_bench.strategies.ideal:Ideal",
    summary="upper bound: each client trains on all its data of tasks 1..t",
    paper="joint training upper bound (as in the FedGP paper's tables)",
    roles=frozenset({Role.LEARNER}),
)

FEDPROX = Declaration(
    name="fedprox",
    target="cfl_bench.strategies.fedprox:FedProx",
    summary="proximal term (μ/2)‖θ − θ_g‖² to the round's global model",
    paper="Li et al., MLSys 2020 (FedProx)",
    roles=frozenset({Role.LOSS_TERM}),
    options=FedProxOptions,
)

FEDCURV = Declaration(
    name="fedcurv",
    target="cfl_bench.strategies.fedcurv:FedCurv",
    summary="Fisher-weighted penalty towards the other clients' parameters",
    paper="Shoham et al., 2019 (FedCurv)",
    roles=frozenset({Role.LOSS_TERM}),
    options=FedCurvOptions,
    payloads=(
        Payload("fedcurv.U", "broadcast"),
        Payload("fedcurv.V", "broadcast"),
        Payload("fedcurv.u", "upload"),
        Payload("fedcurv.v", "upload"),
    ),
)

FEDNTD = Declaration(
    name="fedntd",
    target="cfl_bench.strategies.fedntd:FedNTD",
    summary="distil the round's global model on the not-true classes only",
    paper="Lee et al., NeurIPS 2022 (FedNTD)",
    roles=frozenset({Role.LOSS_TERM}),
    options=FedNTDOptions,
)

MOON = Declaration(
    name="moon",
    target="cfl_bench.strategies.moon:MOON",
    summary="contrast the representation with the global model's (+) and the last local one's (−)",
    paper="Li, He and Song, CVPR 2021 (MOON)",
    roles=frozenset({Role.LOSS_TERM}),
    options=MOONOptions,
)

LWF = Declaration(
    name="lwf",
    target="cfl_bench.strategies.lwf:LwF",
    summary="distil the outputs of the model that finished the previous task",
    paper="Li & Hoiem, ECCV 2016 (LwF)",
    roles=frozenset({Role.LOSS_TERM}),
    options=LwFOptions,
)

ICARL = Declaration(
    name="icarl",
    target="cfl_bench.strategies.icarl:ICaRL",
    summary=(
        "federated iCaRL: CE on the task's data + the client's exemplars, distilling the "
        "previous task's model on the old classes (class-IL)"
    ),
    paper="Rebuffi et al., CVPR 2017 (iCaRL), federated as in TARGET's code (ICCV 2023)",
    roles=frozenset({Role.LEARNER, Role.LOSS_TERM}),
    options=ICaRLOptions,
    payloads=(Payload("icarl.class_sums", "request"),),
    server_schedule=True,
)

GLFC = Declaration(
    name="glfc",
    target="cfl_bench.strategies.glfc:GLFC",
    summary=(
        "GLFC's clients: herded exemplars + the task's data, class-aware gradient "
        "compensation (BCE re-weighted per old/new group) and relation distillation (class-IL)"
    ),
    paper="Dong et al., CVPR 2022 (GLFC, Federated Class-Incremental Learning)",
    roles=frozenset({Role.LEARNER, Role.LOSS_TERM}),
    options=GLFCOptions,
    payloads=(
        Payload("glfc.proto_grad", "upload"),
        Payload("glfc.best_1", "broadcast"),
        Payload("glfc.best_2", "broadcast"),
        Payload("glfc.best_classes", "broadcast"),
    ),
    # The proxy server: every client checks at round start whether its task changed.
    server_schedule=True,
)

TARGET = Declaration(
    name="target",
    target="cfl_bench.strategies.target:TARGET",
    summary=(
        "TARGET's clients: CE on the task's own classes + kd·KD of the previous task's model "
        "on server-synthesised images of the old classes (data-free, class-IL)"
    ),
    paper="Zhang et al., ICCV 2023 (TARGET), as its official code runs it",
    roles=frozenset({Role.LEARNER, Role.LOSS_TERM}),
    options=TARGETOptions,
    payloads=(Payload("target.pool", "broadcast"),),
    # The synthesis at every task end but the last, after the task's last aggregation.
    server_schedule=True,
)

LANDER = Declaration(
    name="lander",
    target="cfl_bench.strategies.lander:LANDER",
    summary=(
        "LANDER's clients: TARGET's step with features bounded around label-text-embedding "
        "anchors and the old model's embeddings distilled; NAYER synthesis (class-IL)"
    ),
    paper="Tran et al., CVPR 2024 (LANDER), as its official code runs it",
    roles=frozenset({Role.LEARNER, Role.LOSS_TERM}),
    options=LANDEROptions,
    payloads=(Payload("lander.pool", "broadcast"), Payload("lander.loss", "upload")),
    # The synthesis at every task end but the last, after the task's last aggregation.
    server_schedule=True,
)

MFCL = Declaration(
    name="mfcl",
    target="cfl_bench.strategies.mfcl:MFCL",
    summary=(
        "MFCL's clients: new-class CE + the head's CE + the old head's feature distillation "
        "on the batch joined with images from a server-trained generator (data-free, class-IL)"
    ),
    paper="Babakniya et al., NeurIPS 2023 (MFCL), as its official code runs it",
    roles=frozenset({Role.LEARNER, Role.LOSS_TERM}),
    options=MFCLOptions,
    payloads=(Payload("mfcl.generator", "broadcast"),),
    # The generator's training at every task end but the last, after the last aggregation.
    server_schedule=True,
)

EWC = Declaration(
    name="ewc",
    target="cfl_bench.strategies.ewc:OnlineEWC",
    summary="online EWC: (λ/2)·Σ F*(θ − θ*)² with a running Fisher F* ← γF* + F_t per task",
    paper="Schwarz et al., ICML 2018 (online EWC)",
    roles=frozenset({Role.LOSS_TERM}),
    options=OnlineEWCOptions,
)

FEDPROJ = Declaration(
    name="fedproj",
    target="cfl_bench.strategies.fedproj:FedProj",
    summary=(
        "distil the clients' public-data logit ensemble into θ_g; project local gradients "
        "against the ensemble's memory gradient"
    ),
    paper="Chunduru, Morafah et al. 2025 (FedProj)",
    roles=frozenset({Role.AGGREGATOR, Role.GRAD_TRANSFORM}),
    options=FedProjOptions,
    payloads=(
        Payload("fedproj.z_ens", "broadcast"),
        Payload("fedproj.logits", "upload"),
    ),
    # After SCAFFOLD's correction, before FedGP: the distillation projection constrains the
    # corrected gradient, and g_ref then the final direction.
    transform_order=20,
)

FEDGP = Declaration(
    name="fedgp",
    target="cfl_bench.strategies.fedgp:FedGP",
    summary="project local gradients against the clients' averaged buffer gradient at θ_g",
    paper="Dai et al., FedGP / Fed-A-GEM (buffer-based gradient projection)",
    roles=frozenset({Role.GRAD_TRANSFORM}),
    options=FedGPOptions,
    payloads=(
        Payload("fedgp.gref", "broadcast"),
        Payload("fedgp.gref", "request"),
    ),
    server_schedule=True,
    # Last in the transform chain, so g_ref constrains the final direction; its request
    # last after aggregation, so g_ref is taken at the round's final θ_g.
    transform_order=30,
    server_hook_order=10,
)

IFA = Declaration(
    name="ifa",
    target="cfl_bench.strategies.ifa:IFA",
    summary="reset a ρ fraction of θ_g at every generation end",
    paper='"Forget to Generalize: Iterative Adaptation" (IFA), 2026',
    roles=frozenset(),
    options=IFAOptions,
    server_schedule=True,
    # Right after SCAFFOLD's server step. It has no hook there any more (its reset opens the
    # next generation, ``on_round_start``), but keeps its place.
    server_hook_order=-10,
)

FEDDYN = Declaration(
    name="feddyn",
    target="cfl_bench.strategies.feddyn:FedDyn",
    summary="dynamic regulariser −⟨h_k, θ⟩ + (α/2)‖θ − θ_g‖²; server corrects θ_g by −h/α",
    paper="Acar et al., ICLR 2021 (FedDyn)",
    roles=frozenset({Role.AGGREGATOR, Role.LOSS_TERM}),
    options=FedDynOptions,
)

SCAFFOLD = Declaration(
    name="scaffold",
    target="cfl_bench.strategies.scaffold:Scaffold",
    summary="control variates: g ← g − c_k + c at every local step; server c and η_g step",
    paper="Karimireddy et al., ICML 2020 (SCAFFOLD)",
    roles=frozenset({Role.GRAD_TRANSFORM}),
    options=ScaffoldOptions,
    payloads=(
        Payload("scaffold.c", "broadcast"),
        Payload("scaffold.dc", "upload"),
    ),
    # First in the transform chain: it corrects the data gradient, which the projections
    # then constrain; first after aggregation, so θ_g is final before the other hooks.
    transform_order=10,
    server_hook_order=-20,
)

FEDNOVA = Declaration(
    name="fednova",
    target="cfl_bench.strategies.fednova:FedNova",
    summary=(
        "normalised averaging: θ_g ← θ_g − τ_eff·Σ p_k (θ_g − θ_k)/a_k (a_k: local steps, "
        "momentum-corrected)"
    ),
    paper="Wang et al., NeurIPS 2020 (FedNova)",
    roles=frozenset({Role.AGGREGATOR}),
    payloads=(Payload("fednova.tau", "upload"),),
)

FEDAVGM = Declaration(
    name="fedavgm",
    target="cfl_bench.strategies.fedopt:FedAvgM",
    summary="server momentum: v ← βv + (θ_old − θ_avg); θ_g ← θ_old − η_s·v",
    paper="Hsu et al., 2019 (FedAvgM)",
    roles=frozenset({Role.AGGREGATOR}),
    options=FedAvgMOptions,
)

FEDOPT = Declaration(
    name="fedopt",
    target="cfl_bench.strategies.fedopt:FedOpt",
    summary="adaptive server optimizer (adam, yogi, adagrad) on the pseudo-gradient θ_avg − θ_old",
    paper="Reddi et al., ICLR 2021 (FedAdam, FedYogi, FedAdagrad)",
    roles=frozenset({Role.AGGREGATOR}),
    options=FedOptOptions,
)

FEDDF = Declaration(
    name="feddf",
    target="cfl_bench.strategies.feddf:FedDF",
    summary=(
        "distil the round's client-model ensemble (mean logits on public data) into the FedAvg mean"
    ),
    paper="Lin et al., NeurIPS 2020 (FedDF)",
    roles=frozenset({Role.AGGREGATOR}),
    options=FedDFOptions,
)

FOT = Declaration(
    name="fot",
    target="cfl_bench.strategies.fot:FOT",
    summary=(
        "task ends: clients send random sketches of their layer inputs, the server grows each "
        "Linear/Conv2d layer's input basis U; later aggregated updates become Δ − Δ·U·Uᵀ"
    ),
    paper="Bakman, Yaldiz et al., ICLR 2024 (FOT, Federated Orthogonal Training)",
    roles=frozenset({Role.AGGREGATOR}),
    options=FOTOptions,
    payloads=(
        Payload("fot.basis", "broadcast"),
        Payload("fot.ranks", "broadcast"),
        Payload("fot.sketch", "upload"),
        Payload("fot.stats", "upload"),
    ),
)

FEDWEIT = Declaration(
    name="fedweit",
    target="cfl_bench.strategies.fedweit:FedWeIT",
    summary=(
        "task-IL: each layer θ = B ⊙ σ(m) + A + Σ α·kb; the server averages the masked bases B "
        "per channel and sends every client the uploaded sparse A's at each task start"
    ),
    paper="Yoon, Jeong et al., ICML 2021 (FedWeIT, Federated Weighted Inter-client Transfer)",
    roles=frozenset({Role.LOSS_TERM, Role.AGGREGATOR}),
    options=FedWeITOptions,
    payloads=(
        Payload("fedweit.kb", "broadcast"),
        Payload("fedweit.keep", "upload"),
        Payload("fedweit.adaptive", "upload"),
    ),
    scored_by_clients=(
        "fedweit scores each client's own composed model on its own tasks; the global "
        "model holds only the shared bases B with a zero head, so its accuracy is chance"
    ),
)

#: Every registered component, in listing order (learners first).
TABLE: tuple[Declaration, ...] = (
    FEDAVG,
    ER,
    DER,
    DERPP,
    AGEM,
    IDEAL,
    ICARL,
    GLFC,
    TARGET,
    LANDER,
    MFCL,
    FEDPROX,
    FEDCURV,
    FEDNTD,
    MOON,
    LWF,
    EWC,
    FEDPROJ,
    FEDGP,
    IFA,
    FEDDYN,
    SCAFFOLD,
    FEDNOVA,
    FEDAVGM,
    FEDOPT,
    FEDDF,
    FOT,
    FEDWEIT,
)
