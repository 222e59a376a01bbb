"""The explicit state objects the engine hands to strategy components.

Why explicit objects: per-client state (buffer, RNG, component extras) must persist across
rounds and tasks, and server state (global model, payloads) must be visible to server hooks,
without any global variables. A component reads what it needs from these and keeps its own
per-client state under ``client.extras[component_name]``.

Client-side hooks see only what a client could see on another machine: its own
``ClientState``, the round's ``Broadcast`` (θ_g, payloads, round facts) and the model it is
training (``LocalRound``). Server-side hooks see the ``ServerState``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from cfl_bench.core.buffer import ReservoirBuffer
from cfl_bench.core.flat import FlatModel


def stored_as_is(stored: torch.Tensor) -> torch.Tensor:
    """The identity decoder: data that is stored as model inputs already."""
    return stored


@dataclass
class ClientState:
    """Everything one client keeps between rounds and tasks."""

    index: int
    generator: torch.Generator
    buffer: ReservoirBuffer | None
    # Training data of the current task (may include older tasks for the joint learner), in
    # the stream's stored form: read model inputs through ``inputs``.
    train_x: torch.Tensor | None = None
    train_y: torch.Tensor | None = None
    # The task this client is training (its own under an async shift; see TaskClock).
    task: int = 0
    # Tasks this client has already trained on (for the first-pass buffer policy).
    tasks_started: set[int] = field(default_factory=set)
    # The global-model version this client holds (so re-sending it is not counted twice).
    model_version: int = -1
    extras: dict[str, dict[str, object]] = field(default_factory=dict)
    # Stored inputs -> model inputs (the stream's ``as_model_input``; identity by default).
    decode: Callable[[torch.Tensor], torch.Tensor] = field(default=stored_as_is, repr=False)

    @property
    def num_samples(self) -> int:
        return 0 if self.train_y is None else int(self.train_y.shape[0])

    def inputs(self, rows: torch.Tensor) -> torch.Tensor:
        """Model inputs of ``rows`` of the training data.

        Why a method: the data stays compact (uint8 pixels) and only the rows a step, a
        Fisher estimate or a memory fill takes are converted, with the stream's exact
        arithmetic, so the floats are those of a float32 copy of the whole shard.
        """
        if self.train_x is None:
            raise ValueError(f"client {self.index} holds no training data")
        return self.decode(self.train_x[rows])

    def state_for(self, component: str) -> dict[str, object]:
        return self.extras.setdefault(component, {})

    def state_dict(self) -> dict[str, object]:
        """What persists between rounds; the training data is not saved (it is rebuilt from
        the stream: ``ClientData.restore``)."""
        return {
            "generator": self.generator,
            "task": self.task,
            "tasks_started": self.tasks_started,
            "model_version": self.model_version,
            "extras": self.extras,
            "buffer": None if self.buffer is None else self.buffer.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"].get_state())
        self.task = int(state["task"])
        self.tasks_started = set(state["tasks_started"])
        self.model_version = int(state["model_version"])
        self.extras = dict(state["extras"])
        if self.buffer is not None:
            self.buffer.load_state_dict(state["buffer"])


@dataclass
class ServerState:
    """The server's view during a round: θ_g, its version, the participants, the round's
    place in the protocol (the broadcast itself is built from this: ``Broadcast.of``)."""

    model: FlatModel
    global_params: torch.Tensor
    global_buffers: torch.Tensor
    clients: list[ClientState]
    device: torch.device
    # The global task (see TaskClock) and the round's position in it; rounds_per_task is
    # the length of the current global task (R + lag for the first task under a shift).
    task: int = 0
    round_in_task: int = 0
    round_index: int = 0
    rounds_per_task: int = 1
    version: int = 0
    participants: list[ClientState] = field(default_factory=list)

    @property
    def model_bytes(self) -> int:
        return tensor_bytes(self.global_params) + tensor_bytes(self.global_buffers)

    @property
    def is_task_end(self) -> bool:
        return self.round_in_task == self.rounds_per_task - 1


@dataclass(frozen=True)
class Broadcast:
    """What the server sends every participant of a round: θ_g, its version, the components'
    declared payloads and the round's place in the protocol. A client reads nothing else of
    the server, so a client update can run in another process or on another machine."""

    params: torch.Tensor
    buffers: torch.Tensor
    version: int
    payloads: dict[str, torch.Tensor]
    round_index: int
    task: int
    is_task_end: bool
    device: torch.device

    @classmethod
    def of(cls, server: ServerState, payloads: dict[str, torch.Tensor]) -> Broadcast:
        """What ``server`` sends its participants now: θ_g, ``payloads``, the round facts."""
        return cls(
            params=server.global_params,
            buffers=server.global_buffers,
            version=server.version,
            payloads=dict(payloads),
            round_index=server.round_index,
            task=server.task,
            is_task_end=server.is_task_end,
            device=server.device,
        )


@dataclass(frozen=True)
class LocalRound:
    """A client's side of one round: the broadcast it received and the model it trains
    (loaded with θ_g before the first step; the local model after the last).

    ``lr`` is the round's local learning rate (after ``--lr-decay``) and ``steps`` the local
    steps taken (0 before training; ``after_local`` sees the count): SCAFFOLD's control
    variates and FedNova's normalisation are functions of both. ``inputs`` holds what the
    components' step functions need this round (``Component.client_inputs``): per-client
    values live here, with the client's round, and never on a component.
    """

    model: FlatModel
    broadcast: Broadcast
    lr: float = 0.0
    steps: int = 0
    # Each component's ``client_inputs`` for this client's round, by component name (absent:
    # the component does nothing on this client's steps this round).
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The summed step losses of the first local epoch (LANDER's ``best_model`` criterion,
    # the code's ``total_loss``); None before training and on executors that do not keep it.
    first_epoch_loss: torch.Tensor | None = None


@dataclass
class Upload:
    """What one client sends back after local training."""

    client: int
    params: torch.Tensor
    buffers: torch.Tensor
    num_samples: int
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        total = tensor_bytes(self.params) + tensor_bytes(self.buffers)
        return total + sum(tensor_bytes(t) for t in self.extras.values())


@dataclass
class StepContext:
    """One local step of one client; rebuilt cheaply for every batch."""

    model: FlatModel
    client: ClientState
    broadcast: Broadcast
    x: torch.Tensor
    y: torch.Tensor
    task: int
    epoch: int
    offer_to_buffer: bool
    buffer_batch_size: int
    outputs: torch.Tensor | None = None
    # The un-augmented batch (what the buffer stores) when ``x`` was augmented.
    raw_x: torch.Tensor | None = None
    # Train augmentation re-applied to replayed buffer inputs (None: replay as stored).
    replay_augment: Callable[[torch.Tensor], torch.Tensor] | None = None
    # Whether the learner's forward keeps the batch's representation (the features the
    # classifier reads) in ``representation``: set when a component asks for it (MOON), so
    # it costs no second forward pass.
    keep_representation: bool = False
    representation: torch.Tensor | None = None
    # The components' ``client_inputs`` of this client's round (``LocalRound.inputs``).
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)

    def replay_input(self, x: torch.Tensor) -> torch.Tensor:
        """A buffer draw's inputs as the model should see them during local training."""
        return x if self.replay_augment is None else self.replay_augment(x)

    @property
    def stored_input(self) -> torch.Tensor:
        """What the buffer stores for this batch: the input before augmentation."""
        return self.x if self.raw_x is None else self.raw_x


def tensor_bytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()
