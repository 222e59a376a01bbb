"""FedWeIT's server: the sparse aggregation of the clients' bases and the knowledge base
of their task-adaptive weights, sent once at the next task's start (``strategies.fedweit``;
the code's ``Server`` and ``TrainModule.aggregate``).

Why a module of its own: the server's round (sums of the uploads, B_g per channel, the
knowledge base) is one concern, separate from the clients' private state and steps.
``FedWeITServer`` holds it as component methods mixed in before ``Component``, so these
override the component's defaults; ``kb`` is the component's checkpointed state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from cfl_bench.strategies.fedweit_layout import aggregate_bases, layout_of

if TYPE_CHECKING:
    from cfl_bench.core.context import ServerState, Upload


class FedWeITServer:
    """The server's state of a round (the sums of the pruned bases and keep masks, the
    uploaded A's) and of a run (the knowledge base ``kb``)."""

    kb: torch.Tensor | None
    _pruned: torch.Tensor | None
    _kept: torch.Tensor | None
    _uploads: int
    _adaptives: dict[int, torch.Tensor]

    def receive_upload(self, upload: Upload, server: ServerState) -> None:
        """Sum the pruned bases and the keep masks; keep each uploaded A by client."""
        params = upload.params.detach()
        if self._pruned is None:
            self._pruned, self._uploads = params.clone(), 0
        else:
            self._pruned.add_(params)
        self._uploads += 1
        keep = upload.extras.get("fedweit.keep")
        if keep is not None:
            self._kept = keep.clone() if self._kept is None else self._kept.add_(keep)
        if "fedweit.adaptive" in upload.extras:
            self._adaptives[upload.client] = upload.extras["fedweit.adaptive"].clone()

    def aggregate(self, server: ServerState) -> None:
        """B_g per channel over the clients that kept it (sparse), else the plain mean (the
        code's unweighted ``1/len(clients)``)."""
        if self._pruned is None:
            return
        if self._kept is not None:
            layout = layout_of(server.model)
            server.global_params = aggregate_bases(self._pruned, self._kept, layout)
        else:
            server.global_params = self._pruned / self._uploads
        self._pruned, self._kept, self._uploads = None, None, 0

    def after_aggregate(self, server: ServerState) -> None:
        """At a task end: the knowledge base, one row per client (zero for a client that
        sent no A), in client order."""
        if not self._adaptives:
            return
        kb = server.global_params.new_zeros(len(server.clients), server.global_params.numel())
        for index, adaptive in self._adaptives.items():
            kb[index] = adaptive
        self.kb, self._adaptives = kb, {}

    def broadcast(self, server: ServerState) -> dict[str, torch.Tensor]:
        """The knowledge base goes out once, in the first round of the next task."""
        if self.kb is None or server.round_in_task != 0 or server.task == 0:
            return {}
        return {"fedweit.kb": self.kb}
