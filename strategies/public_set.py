"""The public (unlabelled) set of the distillation methods (FedProj, FedDF).

Option ``public``: a named dataset read through ``StrategyEnv.public_images`` —
``fashion-mnist`` (the Fashion-MNIST test split, for 1×28×28 streams) or ``cifar100`` (the
CIFAR-100 train split, for 3×32×32 streams such as CIFAR-10: FedDF's own pairing) — a seeded
subset of ``public_size`` images; or ``holdout``: every task withholds ``public_size`` of its
training inputs from all clients (default 10 % of them, at most 1000), and the public set is
the union of the slices of the tasks seen so far. A holdout changes what the clients hold,
so it is part of the protocol hash (``holdout_protocol``). ``auto`` picks fashion-mnist for
1×28×28 streams and holdout otherwise.

Named sets are converted to model inputs by the stream's own ``as_model_input``
(``StrategyEnv.public_inputs``): scaled to [0, 1] and normalised with the stream's mean/std
where the stream normalises, so the public images look like the stream's own. Public inputs
are assumed to be available to every party beforehand, like a public dataset, so they are
never counted as communication.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import torch

from cfl_bench.core.errors import UserError
from cfl_bench.core.seeding import generator
from cfl_bench.strategies.declarations import (  # noqa: F401 - PUBLIC_CHOICES re-exported (tests)
    PUBLIC_CHOICES,
    FedDFOptions,
    FedProjOptions,
)

if TYPE_CHECKING:
    from cfl_bench.strategies.base import StrategyEnv

# Image shape (C, H, W) of each named set (``streams.public_data.PUBLIC_SHAPES``; a test pins
# the two tables together, since strategies do not import streams).
PUBLIC_SHAPES: dict[str, tuple[int, ...]] = {"fashion-mnist": (1, 28, 28), "cifar100": (3, 32, 32)}
# What --data-root must hold for each set (``streams.public_data.PUBLIC_HOLDS``).
PUBLIC_HOLDS: dict[str, str] = {
    "fashion-mnist": "FashionMNIST/raw/t10k-*-ubyte[.gz]",
    "cifar100": "cifar-100-python/train",
}
FASHION_SHAPE = PUBLIC_SHAPES["fashion-mnist"]
PIXEL_LEVELS = 255.0
AUTO_PUBLIC_SIZE = 1000
AUTO_HOLDOUT_TEXT = "10% (at most 1000)"


def resolve_public(choice: str, input_shape: tuple[int, ...]) -> str:
    """``auto`` → fashion-mnist for the 1×28×28 MNIST streams (FedProj's pairing of MNIST
    with a Fashion-MNIST proxy), holdout for any other input shape."""
    if choice != "auto":
        return choice
    return "fashion-mnist" if tuple(input_shape) == FASHION_SHAPE else "holdout"


def _shape_text(shape: tuple[int, ...]) -> str:
    return "×".join(str(d) for d in shape)


def load_public(
    env: StrategyEnv, owner: str, name: str, size: int, seed: int, stream: str = ""
) -> torch.Tensor:
    """Model inputs of a seeded random subset of ``size`` images of the named set ``name``
    (all of them when ``size`` is larger), on ``env.device``; ``owner`` names the component
    in refusals and, unless ``stream`` is given (its ``random_stream``), seeds the subset's
    draw.

    Refused: a set whose image shape differs from the stream's inputs, or a data root that
    lacks the set's files.
    """
    shape = PUBLIC_SHAPES[name]
    if tuple(env.input_shape) != shape:
        raise UserError(
            f"{owner}:public={name} has {_shape_text(shape)} images but this stream's inputs "
            f"are {_shape_text(tuple(env.input_shape))}; use {owner}:public=holdout for this "
            "stream."
        )
    read = env.public_images
    images = None if env.data_root is None or read is None else read(name)
    if images is None:
        if env.data_root is None:
            where = "no --data-root was given"
        elif read is None:
            where = "this run offers no public data"
        else:
            where = f"{Path(env.data_root) / PUBLIC_HOLDS[name]} is missing"
        raise UserError(
            f"{owner}:public={name} needs {PUBLIC_HOLDS[name]} under --data-root but {where}; "
            f"pass a --data-root that holds it, or use {owner}:public=holdout."
        )
    count = images.shape[0]
    if size < count:
        pick = torch.randperm(count, generator=generator(seed, stream or owner, "public"))[:size]
        images = images[torch.sort(pick).values]
    return as_inputs(env, images.to(device=env.device))


def as_inputs(env: StrategyEnv, images: torch.Tensor) -> torch.Tensor:
    """uint8 images → model inputs as the stream forms its own (``env.public_inputs``); a
    stream that stores floats (identity conversion) or a run without the converter gets the
    images scaled to [0, 1] — what the unnormalised MNIST streams do."""
    convert = env.public_inputs
    out = images if convert is None else convert(images)
    if not out.is_floating_point():
        out = images.to(dtype=torch.float32).div_(PIXEL_LEVELS)
    return out


def holdout_size(public: str, public_size: int | None, train_size: int) -> int:
    """Holdout mode: ``public_size`` per task, or by default 10 % of the task's training
    examples (at most 1000) — a fixed 1000 would take 70 % of a small stream's data. Named
    sets withhold nothing."""
    if public != "holdout":
        return 0
    if public_size is not None:
        return public_size
    return max(1, min(AUTO_PUBLIC_SIZE, train_size // 10))


def holdout_protocol(public: str, public_size: int | None) -> dict[str, object]:
    """A holdout takes training data away from every client: a different protocol."""
    if public != "holdout":
        return {}
    size: object = public_size if public_size is not None else AUTO_HOLDOUT_TEXT
    return {"public_holdout_per_task": size}


def with_holdout(
    public_x: torch.Tensor | None, holdout: torch.Tensor | None, device: torch.device
) -> torch.Tensor | None:
    """The public memory after a task's withheld inputs join it (tasks seen so far)."""
    if holdout is None or holdout.shape[0] == 0:
        return public_x
    part = holdout.to(device=device, dtype=torch.float32)
    return part if public_x is None else torch.cat([public_x, part])


class PublicSetUser:
    """The public-set bookkeeping FedProj and FedDF share, as component methods: how much a
    holdout withholds, what it changes in the protocol, and growing the public set with each
    task's holdout. Mixed in before ``Component`` (``class FedDF(PublicSetUser,
    Component)``), so these override the component defaults."""

    # The options every public-set user declares (``public``, ``public_size``).
    opts: FedProjOptions | FedDFOptions
    public: str
    public_size: int | None
    public_x: torch.Tensor | None
    device: torch.device
    random_stream: ClassVar[str]  # the component's (``Component.random_stream``)

    def setup_public(self, env: StrategyEnv) -> str:
        """Resolve option ``public`` (``auto`` → by input shape; the run's config records
        the resolved choice) and the declared size; the set itself starts empty."""
        public = resolve_public(self.opts.public, env.input_shape)
        self.opts = replace(self.opts, public=public)
        self.public = public
        self.public_size = self.declared_public_size()
        self.device = env.device
        self.public_x = None
        return public

    def load_named_public(self, env: StrategyEnv, owner: str) -> None:
        """A named set (fashion-mnist, cifar100): its seeded subset of ``public_size``
        images (default 1000), as model inputs; a holdout arrives task by task instead."""
        if self.public in PUBLIC_SHAPES:
            count = self.public_size or AUTO_PUBLIC_SIZE
            self.public_x = load_public(
                env, owner, self.public, count, env.seed, self.random_stream
            )

    def fixed_public_size(self) -> int:
        """Examples of the public set before any task's holdout joins it: a named set's
        subset once set up, else 0 (the cost estimate adds the holdouts itself)."""
        fixed = getattr(self, "public_x", None)  # unset before ``setup``
        return 0 if fixed is None else int(fixed.shape[0])

    def declared_public_size(self) -> int | None:
        return self.opts.public_size

    def holdout_per_task(self, train_size: int) -> int:
        """Holdout mode: ``public_size`` per task, or 10 % of the task (at most 1000)."""
        return holdout_size(self.opts.public, self.declared_public_size(), train_size)

    def protocol_changes(self) -> dict[str, object]:
        """A holdout takes training data away from every client: a different protocol."""
        return holdout_protocol(self.opts.public, self.declared_public_size())

    def on_task_start(self, server: object, task: int, holdout: torch.Tensor | None) -> None:
        """Holdout mode: the task's withheld inputs join the public set (tasks seen so far).
        FedProj's Z_ens keeps covering only the examples it was computed on; the new slice
        gets ensemble logits at the end of this task's first round."""
        if self.public == "holdout":
            self.public_x = with_holdout(self.public_x, holdout, self.device)
