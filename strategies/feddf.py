"""FedDF: ensemble distillation for model fusion.

Lin, Kong, Stich, Jaggi, "Ensemble Distillation for Robust Model Fusion in Federated
Learning", NeurIPS 2020 (Algorithm 1). After the round's FedAvg mean θ_avg, the server
distils the ensemble of the round's received client models {θ_k}_{k∈S} into it on unlabelled
public inputs x_pub, with temperature T and softmax σ:

    Z_ens(x) = (1/|S|)·Σ_{k∈S} f(x; θ_k)                       (the mean of the logits)
    θ_g = θ_avg, then ``distill_steps`` Adam steps on batches of x_pub minimising
          KL(σ(Z_ens/T) ‖ σ(f(x; θ_g)/T))                       (batchmean, no T² factor)

Defaults and details from the authors' code (github.com/epfml/federated-learning-public-code,
codes/FedDF-code: ``pcode/aggregation/noise_knowledge_transfer.py``, scheme
``noise_knowledge_transfer`` with ``update_student_scheme=avg_logits`` as the README's
commands use it): Adam lr 1e-3 with cosine annealing to 0 over the distillation steps
(``CosineAnnealingLR`` stepped after every batch), T = 1 (``KL_temperature=1``; their
``divergence`` is ``kl_div(log σ(s/T), σ(t/T), batchmean)`` without T²), gradient-norm
clipping at 5 (``clip_grad_norm_(…, 5)`` before every step), the teachers in eval mode and
the student in train mode, a fresh optimizer every round, batches of the run's batch size.
Their unlabelled set for CIFAR-10 is the CIFAR-100 train split (``data_name=cifar100``),
here option ``public=cifar100``.

Deliberate differences:

- Steps: the authors run up to 10⁴ steps (``total_n_server_pseudo_batches=10000``, the
  cosine schedule spanning them), validate every 100 and stop after 1000 steps without
  improvement, returning the best model on a validation split of the *labelled training
  data* — which no server here has (clients keep their data; the holdout is unlabelled for
  the server). So there is no early stopping: ``distill_steps`` (default 500) steps, the
  schedule spanning exactly those, and the last model is kept. 500 keeps the per-round
  server cost near the clients' on the CPU protocols; raise it to approach the authors'.
- The teacher's logits are computed once per upload, not per batch: the server holds every
  uploaded θ_k (that is what FedAvg receives), loads it into a scratch copy of the model in
  ``receive_upload`` and labels the whole public set there, keeping only the running sum of
  the logits (the ensemble is their mean). Nothing beyond the model is communicated. The
  authors re-evaluate the teachers on each batch, identical values in eval mode.
- BatchNorm statistics of the student follow train mode during distillation (as the
  authors'), and the distilled buffers become the global buffers.

Public data (``strategies.public_set``): ``cifar100`` for 3×32×32 streams, ``fashion-mnist``
for 1×28×28, or ``holdout`` (each task withholds ``public_size`` training inputs from every
client; a protocol change), ``auto`` as for FedProj (fashion-mnist for 1×28×28, else
holdout). Named sets are normalised by the stream's own input conversion.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, ClassVar

from cfl_bench.core.evaluation import predict_logits
from cfl_bench.core.flat import FlatModel
from cfl_bench.core.seeding import generator
from cfl_bench.strategies import declarations
from cfl_bench.strategies.base import Component, Declaration, ExtraWork, StrategyEnv
from cfl_bench.strategies.declarations import FedDFOptions
from cfl_bench.strategies.distillation import distill, teacher_log_probs
from cfl_bench.strategies.public_set import PublicSetUser

if TYPE_CHECKING:
    import torch

    from cfl_bench.core.context import ServerState, Upload

CLIP_NORM = 5.0  # the authors' clip_grad_norm_ before every student step


class FedDF(PublicSetUser, Component):
    declaration: ClassVar[Declaration] = declarations.FEDDF
    opts: FedDFOptions
    requires: ClassVar[frozenset[str]] = frozenset({"class_logits"})
    # The public set grows with every task's holdout; the distillation draws continue. The
    # per-round logit sum is empty at every round end, where checkpoints are written.
    state_attributes: ClassVar[tuple[str, ...]] = ("public_x", "_distill_gen")

    def extra_work(self) -> ExtraWork:
        """Every participant's logits on the public set, and ``distill_steps`` server batches
        over it."""
        return ExtraWork(
            public_examples=self.fixed_public_size(),
            distill_steps=self.opts.distill_steps,
        )

    def setup(self, env: StrategyEnv) -> None:
        self.setup_public(env)
        self.temperature = self.opts.temperature
        self.distill_steps = self.opts.distill_steps
        self.distill_lr = self.opts.distill_lr
        self.batch_size = env.batch_size
        self.load_named_public(env, self.name)
        self._distill_gen = generator(env.seed, self.random_stream, "distill", device=env.device)
        self._logit_sum: torch.Tensor | None = None
        self._logit_count = 0
        self._scratch: FlatModel | None = None

    # -- server -------------------------------------------------------------------------------
    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """The server labels the public set with the uploaded model θ_k (loaded into a
        scratch copy, so the engine's model is untouched) and adds the logits to the sum."""
        if self.public_x is None or self.public_x.shape[0] == 0:
            return
        scratch = self.scratch(server.model)
        scratch.load(upload.params, upload.buffers)
        logits = predict_logits(scratch.module, self.public_x)
        if self._logit_sum is None:
            self._logit_sum = logits.clone()  # a normal tensor: inference tensors are read-only
        else:
            self._logit_sum.add_(logits)
        self._logit_count += 1

    def scratch(self, model: FlatModel) -> FlatModel:
        """A copy of the model's architecture for labelling with client models (made once)."""
        if self._scratch is None:
            self._scratch = FlatModel(copy.deepcopy(model.module))
        return self._scratch

    def ensemble(self) -> torch.Tensor | None:
        """Z_ens: the mean of this round's client logits on the public set (None without
        uploads); the sum restarts for the next round."""
        total, count = self._logit_sum, self._logit_count
        self._logit_sum, self._logit_count = None, 0
        if total is None or count == 0:
            return None
        return total.div_(count)

    def aggregate(self, server: ServerState) -> None:
        """θ_g ← θ_avg distilled towards Z_ens for ``distill_steps`` cosine-annealed steps."""
        z_ens = self.ensemble()
        if z_ens is None or self.public_x is None:
            return
        model = server.model
        model.load(server.global_params, server.global_buffers)
        distill(
            model,
            self.public_x[: z_ens.shape[0]],
            teacher_log_probs(z_ens, self.temperature),
            temperature=self.temperature,
            lr=self.distill_lr,
            batch_size=self.batch_size,
            gen=self._distill_gen,
            steps=self.distill_steps,
            scale_by_t_squared=False,
            cosine=True,
            clip_norm=CLIP_NORM,
        )
        server.global_params = model.params.detach().clone()
        server.global_buffers = model.buffers.detach().clone()
