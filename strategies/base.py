"""The component contract every strategy piece implements.

A strategy is a composition ``learner+component+…`` (see ``strategies.compose``). Each
component declares its roles, options (with defaults and parsers), requirements, payloads
and the paper it follows; the engine calls only the hooks below, in the order of
docs/architecture.md, "One round" (their do-nothing defaults are ``strategies.hooks``'s
``ClientHooks`` and ``ServerHooks``, which ``Component`` inherits):

    task start       component.on_task_start(server, task, holdout)  (public holdout slice)
                     component.on_holdout_labels(server, task, x, y)  (its labels, if any)
    round start      component.on_round_start(server)        (IFA: reset, then snapshot)
                     component.broadcast(server)            → declared payloads (counted)
    client start     inputs = component.round_inputs(broadcast)     (once per round)
                             | component.client_inputs(client, local)   (local: LocalRound)
    each local step  (``engine.step_driver``, the one place this order is written)
                     loss = the objective's loss on the batch + learner.replay_plan()'s
                            terms + Σ component.loss_term(outputs, z, y, mask, values)
                                                 (autograd terms; values: the component's
                                                 frozen forwards and inputs)
                     backward into the flat gradient g
                     g, value = component.penalty(θ, g, inputs)   (closed-form θ penalties)
                     g = learner.refine(g, view)             (A-GEM)
                     g = component.transform(g, inputs, view)   in ``compose.TRANSFORM_CHAIN``
                     optimizer step; the batch offered to the buffer when
                     learner.offers_batches()   (buffer insertion)
    after training   component.after_local(client, upload, local) → declared upload payloads
    server           component.receive_upload(upload, server) for every upload as it arrives;
                     FedAvg into θ_g; the aggregator override's aggregate(server) (FedProj);
                     in ``compose.SERVER_HOOK_ORDER``: component.after_aggregate(server),
                     then component.client_request(server) → the executor computes it on
                     the named clients at θ_g → the request's on_reply(summed answers)
                     (FedGP's reference gradient last, at the final θ_g of the round)
    evaluation       θ_g scored by the model's outputs, or by the first component's
                     evaluation_classifier() where one replaces the classifier (iCaRL's NME)

Client-side hooks (``round_inputs``, ``client_inputs``, the step functions, ``after_local``)
see the client's state, the round's ``Broadcast`` and the model being trained — never the
server — so a client update can run in another process. Server-side hooks see the
``ServerState``. No component counts traffic or tracks model versions: it declares its
``payloads`` and the engine moves and counts them (``cfl_bench.core.payloads``).

State lives in explicit objects: per-client state in ``ClientState.extras[component]`` and
server state on the component instance (one instance per run, its ``state_attributes``
saved by checkpoints); nothing is global. What a client's steps need this round (θ_g and
the broadcast g_ref from ``round_inputs``, its control variate from ``client_inputs``) is
kept by the executor with that client's ``LocalRound`` — never an attribute of the
component, which serves every client.

The step functions (``penalty``, ``transform``) are pure functions of tensors with the
parameter axis last: one client's θ and g are (P,), a chunk of clients' (C, P), and each
input is either shared by the chunk ((P,), θ_g) or one row per client ((C, P), stacked by
the executor). ``loss_term`` is one client's term on its batch's outputs (the vectorized
executor vmaps it over the chunk, with a row mask for padded batches), reading the forwards
without gradient it declares (``frozen_forwards``), which each executor computes its own
way. So the sequential executor and the vectorized one run the very same code, and a new
component runs under both without an executor edit. Dot products over the parameter axis
go through ``projection.row_dot``.

What is known of a component before a run (its name, roles, options, payloads, places in
the orders) is its row of the torch-free declaration table (``strategies.declarations``): the
grammar (``strategies.compose``), `cfl-bench list strategies` and the run's early refusals
read only that table, so a misspelled strategy is refused without paying torch's
seconds-long import, while the component modules import torch at their top like any
module. This module, ``strategies.replay`` and the table stay torch-free. A component's
options are a frozen dataclass (``option``), its values ``self.opts``, typed; the roles'
hooks are the protocols of ``strategies.roles``.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from cfl_bench.core.errors import UserError
from cfl_bench.core.objective import Classification, Objective
from cfl_bench.core.payloads import Payload
from cfl_bench.core.text_values import (  # noqa: F401 - the option parsers components use
    boolean,
    finite_float,
    non_negative_float,
    non_negative_int,
    positive_float,
    positive_int,
    quoted,
    strict_int,
    unit_fraction,
)
from cfl_bench.strategies.hooks import (  # noqa: F401 - the contract's types, importable here
    Classifier,
    ClientHooks,
    ClientInputs,
    FrozenForward,
    ServerHooks,
    StepView,
)
from cfl_bench.strategies.replay import ReplayPlan

if TYPE_CHECKING:
    import torch
    from torch import nn

    from cfl_bench.core.context import ClientState
    from cfl_bench.core.flat import FlatModel
    from cfl_bench.strategies.replay import ReplaySource


class Role(str, enum.Enum):
    """The roles the engine dispatches on (which list a component joins)."""

    LEARNER = "learner"
    LOSS_TERM = "loss term"
    GRAD_TRANSFORM = "gradient transform"
    AGGREGATOR = "aggregator"


# Roles shown in listings and config.json that follow from what a component implements
# rather than being dispatched on: work on the server's own schedule around aggregation
# (round-start snapshots, post-aggregation client requests), and declared payloads.
SERVER_SCHEDULE = "server schedule"
COMMUNICATION = "communication"


AUTO = "auto"  # the written value of an option resolved from the stream at setup


@dataclass(frozen=True)
class Option:
    """One named, typed option of a component, e.g. ``der:alpha=0.5``.

    ``parse`` receives the value with surrounding whitespace already removed by the grammar
    and refuses anything else with ``ValueError("must be …")``: the clause says what the
    value must be, and ``convert`` turns it into the one-line refusal
    ``option der:alpha must be a finite number ≥ 0, got 'inf'.``
    """

    name: str
    default: object
    help: str
    parse: Callable[[str], object]
    choices: tuple[str, ...] = ()
    # How a parsed value is written back in the strategy's canonical name; it must parse
    # to the same value (e.g. ifa's generation None → "task").
    show: Callable[[Any], str] = lambda value: AUTO if value is None else str(value)
    # An option added after runs were recorded: left at its default it is not written into
    # the run's config (``Component.resolved_options``), so those runs keep their protocol
    # hash and sweeps still recognise them as done. Only for options whose default keeps
    # the behaviour the earlier runs had.
    quiet_default: bool = False

    def convert(self, component: str, raw: str) -> object:
        """The typed value of ``raw``, or a ``UserError`` naming the option and the rule.

        An option whose default is None is resolved at setup from the stream (``der:alpha``,
        ``fedproj:public_size``); ``auto`` names that default explicitly, as the listing
        shows it."""
        if self.default is None and raw == AUTO:
            return None
        where = f"option {component}:{self.name}"
        if self.choices and raw not in self.choices:
            raise UserError(f"{where} must be one of {', '.join(self.choices)}, got {quoted(raw)}.")
        try:
            return self.parse(raw)
        except (TypeError, ValueError) as exc:
            clause = " ".join(str(exc).split()).rstrip(".")  # always one line
            if not clause.startswith("must "):  # a parser that did not follow the convention
                clause = f"has an invalid value ({clause or type(exc).__name__})"
            raise UserError(f"{where} {clause}, got {quoted(raw)}.") from None


def text(raw: str) -> str:
    """A word checked against the option's ``choices`` by ``Option.convert``."""
    return raw


def _show(value: object) -> str:
    return AUTO if value is None else str(value)


_OPTION = "cfl_bench.option"


@dataclass(frozen=True)
class _OptionSpec:
    """What ``option`` keeps in a field's metadata (``Option`` less name and default)."""

    help: str
    parse: Callable[[str], object]
    choices: tuple[str, ...]
    show: Callable[[Any], str]
    quiet_default: bool


def option(
    default: Any,
    help: str,
    parse: Callable[[str], object],
    *,
    choices: tuple[str, ...] = (),
    show: Callable[[Any], str] = _show,
    quiet_default: bool = False,
) -> Any:
    """A field of a component's frozen ``Options`` dataclass: its default and, as field
    metadata, what the grammar and the listing need (help, parser, choices, how the
    canonical name writes it). Typed ``Any`` so the field's own annotation is its type::

        @dataclass(frozen=True)
        class DEROptions:
            alpha: float | None = option(None, "weight of the logit term", non_negative_float)

    Why a dataclass rather than a dict: a component reads ``self.opts.alpha``, typed, with no
    cast at use, and the values cannot change behind the run's recorded config."""
    spec = _OptionSpec(help, parse, choices, show, quiet_default)
    return field(default=default, metadata={_OPTION: spec})


@dataclass(frozen=True)
class NoOptions:
    """The options of a component that takes none."""


def options_of(options: type[Any]) -> tuple[Option, ...]:
    """The ``Option`` of every field of an ``Options`` dataclass, in declaration order (the
    order listings show them and the run's config records them)."""
    declared: list[Option] = []
    for f in fields(options):
        spec = f.metadata.get(_OPTION)
        if spec is None or f.default is MISSING:
            raise TypeError(f"{options.__name__}.{f.name} is not declared with option(...)")
        declared.append(
            Option(
                f.name,
                f.default,
                spec.help,
                spec.parse,
                choices=spec.choices,
                show=spec.show,
                quiet_default=spec.quiet_default,
            )
        )
    return tuple(declared)


#: Capabilities a model (not the stream's objective) provides; the run's model facts say which
#: of them its model has (``cfl_bench.runner.model_catalogue`` lists them per model).
MODEL_CAPABILITIES: frozenset[str] = frozenset({"features"})


@dataclass(frozen=True)
class ModelFacts:
    """What the run's model offers components beyond its outputs, bound by the run from the
    torch-free model catalogue (strategies import no catalogue).

    ``features``: the model has ``representation(x)`` (the features its classifier reads) and
    ``classify(z)``, with ``forward(x) == classify(representation(x))`` (MOON contrasts
    representations). ``offered_by`` names, per capability, the models that offer it, for the
    refusal's hint.
    """

    name: str = ""
    capabilities: frozenset[str] = frozenset()
    offered_by: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def models_offering(self, capability: str) -> tuple[str, ...]:
        return dict(self.offered_by).get(capability, ())


@dataclass(frozen=True)
class StrategyEnv:
    """What a component may know about the run when it is set up."""

    stream_name: str
    scenario: str
    num_classes: int
    num_tasks: int
    device: torch.device
    seed: int
    batch_size: int
    input_shape: tuple[int, ...]
    data_root: str | None
    # Public (unlabelled) images by set name, uint8 (N, C, H, W), or None when the data root
    # lacks them: the run binds ``streams.public_data.public_images`` to its --data-root, so
    # strategies read datasets without importing streams. None: this run offers no public data.
    public_images: Callable[[str], torch.Tensor | None] | None = None
    # The stream's ``as_model_input``: stored uint8 images → the model's float inputs (scaled,
    # and normalised where the stream normalises), so public images look like the stream's.
    # None: scale to [0, 1] only (what the unnormalised MNIST streams do).
    public_inputs: Callable[[torch.Tensor], torch.Tensor] | None = None
    # The stream's task objective (loss, predictions, metric, buffer outputs); components
    # take their loss from it (``Component.objective``) and their requirements are checked
    # against its capabilities.
    objective: Objective = field(default_factory=Classification)
    # The run's model: its name and capabilities (none unless the run says so).
    model: ModelFacts = field(default_factory=ModelFacts)
    # The clients' local optimizer (``--optimizer``: sgd or adam) and its SGD momentum
    # (``--momentum``): FedNova's normalising vector and SCAFFOLD's control-variate divisor
    # depend on how a local step moves θ, and both refuse what they cannot normalise.
    optimizer: str = "sgd"
    momentum: float = 0.0
    # A class-incremental stream's classes per task (task t holds [t·c, (t+1)·c)); 0 for
    # every other stream. iCaRL distils the classes of the tasks before the client's.
    classes_per_task: int = 0
    # The run's --clients (0: not known, e.g. a pilot run); TARGET sizes its synthetic batch
    # by it as its code does by num_users.
    num_clients: int = 0
    # The sentence encoder (texts → float32 unit vectors, ``streams.text.encode_texts``),
    # bound by the runner so strategies import no stream module; None: this run offers
    # none. LANDER encodes its class names with it.
    encode_texts: Callable[[Sequence[str]], torch.Tensor] | None = None
    # A class-split stream's ``--class-order``: ``class_order[i]`` is the original class of
    # label i (None: natural order), so what names classes by label (LANDER's anchors)
    # names label i after that class.
    class_order: tuple[int, ...] | None = None


#: A task end's server work by kind: (units per task end, one unit's callable) each.
TaskEndWork = tuple[tuple[float, Callable[[], object]], ...]


@dataclass(frozen=True)
class ExtraWork:
    """The work a component adds to each round outside the local steps, as sample counts.

    Why declared: the run's cost estimate (``cfl_bench.runner.cost``) multiplies these counts by
    measured per-sample times, so a method that does extra work changes the estimate by
    declaring it here, and the estimate never needs to know the method. Zero (or None):
    no such work. Components' declarations add up.
    """

    # A client request after aggregation: a forward + backward over up to this many
    # examples of each contributing client's buffer (``math.inf``: all of it), every
    # ``request_interval`` rounds (FedGP's reference gradient).
    request_samples: float = 0
    request_interval: int = 1
    # A forward + backward over up to this many of each participant's current examples, in
    # whole batches of the run's batch size (FedCurv's Fisher).
    shard_samples: int = 0
    # A public set of this many fixed examples (None: none; the tasks' public holdouts so far
    # add to it): every participant computes logits on it, and the server distils over it
    # for ``distill_epochs`` passes plus ``distill_steps`` batches (FedProj, FedDF).
    public_examples: int | None = None
    distill_epochs: int = 0
    distill_steps: int = 0
    # A forward pass (no backward) over each participant's current examples in every task's
    # last round (FOT's task-end activations).
    task_end_forward: bool = False
    # In the round a participant starts a task (``TaskClock.client_task_start``): this many
    # forward + backward samples on the client, and this many units of server work for it,
    # each unit one call of ``server_unit``, which the probe times (GLFC: 50 prototype steps
    # per class of its task; per class, one L-BFGS closure of the gradient inversion through
    # the LeNet encoder, a model the probe would not time otherwise).
    task_start_samples: int = 0
    task_start_server_units: int = 0
    server_unit: Callable[[], object] | None = field(default=None, compare=False)
    # Forward passes over every client's training samples (its shard and exemplars) at each
    # of its task ends, whether it trained that round or not (iCaRL's herding; with the
    # nearest-mean classifier a second pass for the class sums).
    task_end_client_passes: int = 0
    # Server work at every task end but the run's last, sized by the run's model: called
    # with the model, it returns its kinds of work, each (units per task end, one unit's
    # callable for the probe to time), which the estimate stores as
    # ``task_end_server_units`` and ``server_unit`` of one declaration per kind (FOT's
    # basis SVDs, one per projected layer, whose sizes the model's layers set; a synthesis's
    # plain and adversarial generator steps and its KD steps, whose costs differ). One
    # declaration uses ``server_unit`` for one kind of server work only.
    task_end_server: Callable[[torch.nn.Module], TaskEndWork] | None = field(
        default=None, compare=False
    )
    task_end_server_units: float = 0
    # Rows each local step forwards and back-propagates besides its batch, in every task
    # after the first (MFCL's ``syn_size`` generated rows joined to the batch), priced as
    # forward + backward samples.
    step_rows_after_first_task: int = 0


def listed_roles(
    roles: frozenset[Role], server_schedule: bool, payloads: tuple[Payload, ...]
) -> list[str]:
    """Every role a listing and config.json show, sorted: the dispatched ones plus the
    server schedule and communication a component declares."""
    names = {role.value for role in roles}
    if server_schedule:
        names.add(SERVER_SCHEDULE)
    if payloads:
        names.add(COMMUNICATION)
    return sorted(names)


@dataclass(frozen=True)
class Declaration:
    """What is known of a component without importing it (and so without torch): the row
    of ``strategies.declarations.TABLE`` that the grammar, the listing and the run's
    canonical name read. The component class named by ``target`` takes these values
    (``Component.__init_subclass__``), so they are written once."""

    name: str
    # "module:Class", imported only when a run builds the strategy; a plugin's is filled in
    # from its class (``strategies.plugins``), so a plugin leaves it empty.
    target: str = ""
    summary: str = ""
    paper: str = ""
    roles: frozenset[Role] = frozenset()
    options: type[Any] = NoOptions
    # What it sends besides the model (see ``cfl_bench.core.payloads``).
    payloads: tuple[Payload, ...] = ()
    # Work on the server's own schedule around aggregation (a round-start snapshot, a
    # client request after aggregation): shown as a role, never dispatched on.
    server_schedule: bool = False
    transform_order: int | None = None
    server_hook_order: int = 0
    # Why the global model is not what the method is scored by (its clients keep private
    # per-task models the global one lacks); empty: the global model is. A run of such a
    # component reports no global accuracy-derived numbers (``core.metrics.summarize``).
    scored_by_clients: str = ""

    @property
    def is_learner(self) -> bool:
        return Role.LEARNER in self.roles

    def role_names(self) -> list[str]:
        return listed_roles(self.roles, self.server_schedule, self.payloads)

    @property
    def option_list(self) -> tuple[Option, ...]:
        return options_of(self.options)


class Component(ServerHooks, ClientHooks):
    """Base class: a component with no hooks does nothing (every hook is optional).

    A registered component names its row of the declaration table (``declaration``), which
    sets ``name``, ``roles``, ``summary``, ``paper``, ``Options``, ``payloads``,
    ``server_schedule`` and both orders; a component outside the table (a test's) sets
    those class attributes itself. ``options`` follows from ``Options``."""

    declaration: ClassVar[Declaration | None] = None
    name: ClassVar[str] = ""
    roles: ClassVar[frozenset[Role]] = frozenset()
    summary: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    # The frozen dataclass of its options; an instance's values are ``self.opts``.
    Options: ClassVar[type[Any]] = NoOptions
    # The grammar's view of ``Options`` (derived, never written by hand).
    options: ClassVar[tuple[Option, ...]] = ()
    needs_buffer: ClassVar[bool] = False
    requires: ClassVar[frozenset[str]] = frozenset()
    # What this component sends besides the model (see ``cfl_bench.core.payloads``).
    payloads: ClassVar[tuple[Payload, ...]] = ()
    server_schedule: ClassVar[bool] = False
    # Instance attributes that change during a run and must survive a checkpoint (tensors,
    # generators, numbers and containers of them); everything else is rebuilt by setup().
    state_attributes: ClassVar[tuple[str, ...]] = ()
    # Its place in a local step's gradient-transform chain (``Strategy.transforms``, lowest
    # first); every component with the gradient-transform role declares one, so a new
    # transform takes its place without an edit of the composition.
    transform_order: ClassVar[int | None] = None
    # Its place among the server hooks after aggregation (``Strategy.server_hooks``, lowest
    # first); components at the same place keep the written order, the learner first.
    server_hook_order: ClassVar[int] = 0
    # Whether ``after_local`` does anything (uploads a payload, updates the client's state):
    # the vectorized executor then loads each client's trained row into the working model
    # to run it. Declared by every component overriding ``after_local`` (a test checks).
    uses_after_local: ClassVar[bool] = False
    # Why only the sequential executor runs it (empty: every executor may): a component
    # that trains client-private tensors outside θ in its own hooks (FedWeIT's masks and
    # task-adaptive weights) is refused by the vectorized and Flower executors with it.
    sequential_only: ClassVar[str] = ""
    # The key of this component's random draws (``core.seeding.generator``): the name of the
    # first declared class of its line, so a subclass (a user's plugin, under any name)
    # draws what its parent draws and, unchanged, gives its parent's records exactly. A
    # subclass wanting draws of its own sets it.
    random_stream: ClassVar[str] = ""
    # Whether the component takes a client's task t to be the stream's task t with all of
    # tasks 0..t behind it (iCaRL's old/seen classes [0, t·c) and exemplar budget): such a
    # component is refused under ``--task-order per-client`` (``runner.run_checks``).
    assumes_stream_order: ClassVar[bool] = False
    # From the declaration: why the global model is not what this component is scored by.
    scored_by_clients: ClassVar[str] = ""

    # The typed option values (each component narrows the annotation to its ``Options``).
    opts: Any

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        declared = cls.__dict__.get("declaration")
        if declared is not None:
            cls.name = declared.name
            cls.roles = declared.roles
            cls.summary = declared.summary
            cls.paper = declared.paper
            cls.Options = declared.options
            cls.payloads = declared.payloads
            cls.server_schedule = declared.server_schedule
            cls.transform_order = declared.transform_order
            cls.server_hook_order = declared.server_hook_order
            cls.scored_by_clients = declared.scored_by_clients
            if not cls.random_stream:
                cls.random_stream = declared.name
        cls.options = options_of(cls.Options)

    @classmethod
    def role_names(cls) -> list[str]:
        """Every role, sorted: the dispatched ones plus its declared schedule and payloads."""
        return listed_roles(cls.roles, cls.server_schedule, cls.payloads)

    def __init__(self, values: dict[str, object] | None = None) -> None:
        known = {opt.name for opt in self.options}
        for key in values or {}:
            if key not in known:
                names = ", ".join(sorted(known)) or "none"
                raise UserError(
                    f"unknown option '{key}' for '{self.name}'; its options are: {names}."
                )
        self.opts = self.Options(**(values or {}))
        self.explicit: frozenset[str] = frozenset(values or {})
        # The stream's objective, set from the environment by ``Strategy.setup``.
        self.objective: Objective = Classification()

    # -- set-up -------------------------------------------------------------------------------
    def setup(self, env: StrategyEnv) -> None:
        """Resolve stream-dependent defaults; refuse unsupported streams."""

    def adjust_schedule(self, rounds_per_task: int, epochs: int) -> tuple[int, int]:
        """Components that change the communication schedule (FedGP equal_comm) do it here."""
        return rounds_per_task, epochs

    def wants_representation(self) -> bool:
        """Whether the local steps must keep the batch's representation
        (``StepContext.representation``); only a component requiring ``features`` may ask."""
        return False

    def wrap_model(self, model: nn.Module) -> nn.Module:
        """The run's model as this component trains it, called once after the model is
        built (from its seeded initialisation) and before anything reads its parameters: a
        component whose method adds trained layers to the network (LANDER's embedding
        head) returns the model with them, which every client trains and FedAvg averages.
        The base component leaves the model as it is."""
        return model

    def resolved_options(self) -> dict[str, object]:
        """The options the run's config records: every value, except quiet options left at
        their default (see ``Option.quiet_default``)."""
        return {
            o.name: getattr(self.opts, o.name)
            for o in self.options
            if not o.quiet_default or o.name in self.explicit
        }

    def holdout_per_task(self, train_size: int) -> int:
        """Of a task's ``train_size`` examples, how many no client may hold (FedProj's
        public holdout)."""
        return 0

    def protocol_changes(self) -> dict[str, object]:
        """What this component changes in the protocol (e.g. data withheld from clients).

        Folded into the protocol hash, so runs whose clients hold different data are never
        ranked as if they shared a protocol."""
        return {}

    def extra_work(self) -> ExtraWork:
        """What this component computes each round besides the local steps (after
        ``setup``), for the run's cost estimate; the base component does nothing extra."""
        return ExtraWork()

    def images(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Image sets for a person to look at, by name: uint8 images (N, C, H, W) and their
        classes (N,). The run writes each new set once as a PNG grid into its folder
        (``runner.image_sets``) and the run report shows them (TARGET: the synthetic pool
        after each task). The default offers none."""
        return {}

    def probe_copy(self) -> None:
        """Called on the cost probe's copy of this component before its warm-up round: a
        component whose server work ``extra_work`` prices (GLFC's gradient inversion, minutes
        per task on CPU) turns it off there, so the probe times the local steps without
        running it. The base component does nothing."""

    # -- state ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, object]:
        """The server-side state a checkpoint keeps (per-client state lives in
        ``ClientState.extras`` and is saved with the client)."""
        return {name: getattr(self, name) for name in self.state_attributes}

    def load_state_dict(self, state: dict[str, object]) -> None:
        missing = set(self.state_attributes) - set(state)
        if missing:
            raise ValueError(f"{self.name} checkpoint lacks {', '.join(sorted(missing))}")
        for name in self.state_attributes:
            setattr(self, name, state[name])


class Learner(Component):
    """A local learner: the base loss on the batch plus its own use of the buffer, stated
    as data and pure functions only — its ``replay_plan`` (the buffer draws and replay
    terms of its loss), ``offers_batches`` (whether the step's batch is offered to the
    buffer) and ``refine``. The executors' one step driver (``engine.step_driver``)
    interprets them; a learner has no loss method to override, so each executor runs
    every learner the same way.

    Overridable beyond those: ``training_data`` (the client's data, not the step: the
    joint learner's growing history, declared by ``needs_history``, which the vectorized
    executor refuses) and ``on_task_end`` (A-GEM's memory fill, outside the steps)."""

    roles: ClassVar[frozenset[Role]] = frozenset({Role.LEARNER})
    # Whether old tasks' training data must be kept (the joint upper bound).
    needs_history: ClassVar[bool] = False
    # Whether ``local_data`` adds examples the client kept from earlier tasks (iCaRL's
    # exemplars): the client's training set then differs from its shard, which the
    # vectorized and Flower executors do not build.
    keeps_exemplars: ClassVar[bool] = False

    def replay_plan(self) -> ReplayPlan:
        """The buffer draws a step makes and the replay terms on them (``strategies.replay``):
        the learner's loss beyond the objective's loss on the batch, declared so that each
        executor runs it its own way (``engine.one_client.plan_loss`` on one client,
        ``engine.vectorized_grad`` on a chunk)."""
        return ReplayPlan()

    def replay_source(self, client: ClientState, epoch: int) -> ReplaySource | None:
        """Where a step's replay draws come from in ``epoch`` of the client's round: its
        reservoir buffer (the default). TARGET walks its synthetic pool instead; a learner
        that overrides this is ``sequential_only`` (the vectorized executor stacks the
        clients' buffers)."""
        return client.buffer

    def epoch_steps(self, client: ClientState) -> int:
        """At most how many batches an epoch of the client's data takes (0: all of them, the
        default). TARGET's code zips its data loader with the synthetic one, so its epoch
        ends with the shorter; a learner that caps is ``sequential_only``."""
        return 0

    def replaces_batch_loss(self) -> bool:
        """Whether the learner's own loss replaces the objective's loss on the batch (its
        replay plan's ``batch_weight`` is then not 1). Read from the options alone, so the
        executors' checks can ask before ``setup`` (a replay plan may need it)."""
        return False

    def offers_batches(self) -> bool:
        """Whether a step offers its batch to the buffer (``engine.one_client.offer_batch``,
        ``engine.vectorized_replay.observe_all``; A-GEM's task-end fill does not: its memory
        is filled at task ends)."""
        return True

    def training_data(
        self, shards: list[tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's training tensors for the current task, from its shards so far.

        ``shards`` holds only the current task's shard unless ``needs_history`` is set.
        """
        return shards[-1]

    def local_data(
        self, client: ClientState, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's training tensors for its task from its ``training_data`` (``x``,
        ``y``, in the stream's stored form) and its own state: iCaRL appends the exemplars
        it kept (``keeps_exemplars``). Called when the client enters a task and when a
        resumed run rebuilds its data (after its state was loaded). The default keeps
        them."""
        return x, y

    def exemplar_memory(self) -> int:
        """At most how many kept examples ``local_data`` adds to a client's task data (0:
        none). The cost estimate counts min(this, the examples the client saw before) as
        training rows; read from the options, so it can be asked before ``setup``."""
        return 0

    def refine(self, g: torch.Tensor, view: StepView) -> torch.Tensor:
        """The learner's own refinement of the step's gradient g ((P,) or (C, P)), after the
        penalties and before the components' transforms (A-GEM's projection); a pure
        function of g and what ``view`` gives, as a component's ``transform``. The default
        refines nothing."""
        return g

    def on_task_end(self, client: ClientState, task: int, model: FlatModel) -> None:
        """Called for every client when a task ends, with ``model`` holding θ_g (eval mode)."""
