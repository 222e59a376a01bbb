"""LANDER: its client objective (``strategies.lander_loss``) against values computed by hand
from the equations of its official code (tmtuan1307/LANDER, methods/lander.py), its
NAYER synthesis, its anchors, its defaults; a tiny run, its resume and its refusals."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pandas as pd
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.context import Broadcast, ClientState, LocalRound, StepContext
from cfl_bench.core.errors import UserError
from cfl_bench.core.flat import FlatModel
from cfl_bench.runner.plan import encode_texts
from cfl_bench.strategies.declarations import LANDEROptions
from cfl_bench.strategies.lander import LANDER
from cfl_bench.strategies.lander_anchors import CIFAR100_NAMES, load_anchors
from cfl_bench.strategies.lander_loss import (
    bounding_loss,
    current_task_loss,
    old_task_loss,
    synthetic_batch,
    task_weights,
)
from cfl_bench.strategies.lander_model import EmbeddingModel
from cfl_bench.strategies.synthesis_nayer import NayerOptions, NayerSynthesizer, nayer_defaults
from cfl_bench.strategies.synthesis_parts import (
    LabelGenerator,
    balanced_targets,
    crop_flip,
    draw_crop_flip,
)
from cfl_bench.strategies.target import PoolWalk
from tests import data_free_runs
from tests.data_free_runs import engine_loss, run_args, two_task_values
from tests.helpers import env
from tests.test_cli import in_process
from tests.test_resume import assert_config_resumes_after_crash

# The tiny CIFAR-10 folder (a module fixture shared with the other data-free learners).
cifar_root = data_free_runs.cifar_root


# -- the losses by hand -------------------------------------------------------------------------


def test_the_bounding_loss_is_the_batch_mse_beyond_the_radius() -> None:
    zeros = torch.zeros(3, 2)
    # (9 + 16 + 0 + 0 + 1 + 0) / 6 rows × dims = 26/6, less r = 0.015
    far = torch.tensor([[3.0, 4.0], [0.0, 0.0], [1.0, 0.0]])
    assert bounding_loss(far, zeros, 0.015).item() == pytest.approx(26 / 6 - 0.015)
    # inside the radius: 0.01 / 4 = 0.0025 < 0.015 → 0
    near = torch.tensor([[0.1, 0.0], [0.0, 0.0]])
    assert bounding_loss(near, torch.zeros(2, 2), 0.015).item() == 0.0
    # anchors of their own: differences (0, 1), (2, 0) → 5/4, less 0.25
    anchored = torch.tensor([[1.0, 1.0], [2.0, 0.0]])
    anchors = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    assert bounding_loss(anchored, anchors, 0.25).item() == pytest.approx(1.0)


def test_the_task_weights_follow_the_codes_alpha_and_beta() -> None:
    # known 3 of 6: α = log2(6/2 + 1) = 2, β = √(1/2) → cur 0.2·1.5·√2, pre 0.4·2/√2
    cur, pre = task_weights(3, 6, 0.2, 0.4)
    assert cur == pytest.approx(0.3 * math.sqrt(2)) and pre == pytest.approx(0.4 * math.sqrt(2))
    # the code's CIFAR-100 task 1 of 5: 20 of 40 → α = log2 21
    assert task_weights(20, 40, 0.2, 0.4) == pytest.approx((0.3472376, 1.2423350))


LN3 = math.log(3.0)


def test_the_current_task_loss_is_the_new_class_ce_plus_ltc_bound() -> None:
    # known = 2, the task's classes {2, 3}: label 3 → softmax([0, ln 3]) → −ln ¾
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3, 9.0]])
    embedding = torch.tensor([[1.0, 1.0]])
    anchors = torch.tensor([[0.0, 0.0], [5.0, 5.0], [5.0, 5.0], [1.0, 0.0]])
    value = current_task_loss(outputs, embedding, torch.tensor([3]), anchors, 2, 2, 5.0, 0.25)
    # the anchor of class 3 is (1, 0): MSE 1/2, beyond r = 0.25 by 0.25, times ltc 5
    assert value.item() == pytest.approx(math.log(4 / 3) + 5 * 0.25)


def test_the_old_task_loss_is_kd_over_the_old_classes_plus_the_embeddings_mse() -> None:
    # KD at T = 2 over the first two outputs: row 1 teacher (¾, ¼) vs uniform → ln 2; row
    # 2 uniform vs (¾, ¼) → ln 4 − ½ ln 3; the third output must not count
    student = torch.tensor([[0.0, 0.0, 9.0], [2 * LN3, 0.0, -9.0]])
    teacher = torch.tensor([[2 * LN3, 0.0, 5.0], [0.0, 0.0, 5.0]])
    kd = (math.log(2.0) + math.log(4.0) - 0.5 * LN3) / 2
    s_emb, t_emb = torch.tensor([[1.0, 0.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    value = old_task_loss(student, teacher, s_emb, t_emb, known=2, temperature=2.0)
    assert value.item() == pytest.approx(kd + (1 + 4) / 4)


def test_the_synthetic_batch_is_syn_bs_local_batches() -> None:
    assert synthetic_batch(1, 128) == 128 and synthetic_batch(2, 32) == 64


# -- the defaults -------------------------------------------------------------------------------


def test_the_options_default_to_the_official_codes_values() -> None:
    o = LANDEROptions()
    # main.py:109, 108, 111, 110; lander.py:23; main.py:104, 95, 97, 96, 98, 90; lander.py:25
    assert (o.ltc, o.r, o.cur, o.pre, o.tau) == (5.0, 0.015, 0.2, 0.4, 2.0)
    assert (o.syn_bs, o.nums, o.syn_round, o.warmup) == (1, 10000, 40, 10)
    assert (o.g_steps, o.synthesis_batch_size, o.kd_steps, o.anchors) == (40, 256, 50, "minilm")
    assert o.best_model  # lander.py:748-771: _fl_train always loads best_model at its end
    e = nayer_defaults()
    # main.py:89, 91–94; lander.py:24, 22, 402
    assert (e.lr_g, e.bn, e.oh, e.adv, e.nz) == (2e-3, 1.0, 0.5, 1.0, 256)
    assert (e.temperature, e.bn_mmt, e.kd_lr, e.kd_momentum, e.kd_weight_decay) == (
        20.0, 0.9, 0.1, 0.9, 2e-4,
    )  # fmt: skip
    n = NayerOptions()
    assert (n.nl, n.norm_mean, n.norm_std, n.norm_lr) == (10, 0.5, 0.2, 0.01)  # 582, 316, 345


# -- the anchors --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm10() -> torch.Tensor:
    return load_anchors("minilm", "seq-cifar10", 10, encode_texts)


def test_a_saved_tensor_gives_the_same_anchors_as_the_encoder(
    minilm10: torch.Tensor, tmp_path: Path
) -> None:
    assert minilm10.shape == (10, 384)
    assert torch.allclose(minilm10.norm(dim=1), torch.ones(10), atol=1e-5)
    path = tmp_path / "anchors.pt"
    torch.save(minilm10.half(), path)  # the code's vectors are float16
    from_file = load_anchors(str(path), "seq-cifar10", 10)
    assert from_file.dtype == torch.float32
    assert torch.allclose(from_file, minilm10, atol=1e-3)
    with pytest.raises(UserError, match="have 10 rows but the stream has 100 classes"):
        load_anchors(str(path), "seq-cifar100", 100)


def test_related_class_names_have_closer_anchors_than_unrelated_ones() -> None:
    anchors = load_anchors("minilm", "seq-cifar100", 100, encode_texts)
    index = {name: i for i, name in enumerate(CIFAR100_NAMES)}

    def cos(a: str, b: str) -> float:
        return float(anchors[index[a]] @ anchors[index[b]])

    assert cos("maple_tree", "oak_tree") > cos("maple_tree", "rocket")
    assert cos("boy", "girl") > cos("boy", "tractor")
    assert cos("pickup_truck", "bus") > cos("pickup_truck", "orchid")


def test_the_encoder_source_needs_known_class_names() -> None:
    with pytest.raises(UserError, match="knows the class names of seq-cifar10, seq-cifar100"):
        load_anchors("minilm", "split-mnist", 10, encode_texts)
    with pytest.raises(UserError, match="does not exist"):
        load_anchors("/no/such/anchors.pt", "seq-cifar10", 10)


# -- the model head and the generator -----------------------------------------------------------


class TinyFeatures(nn.Module):
    """A 4-class model with BatchNorm and the ``features`` capability (3 features)."""

    def __init__(self, side: int = 2) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)
        self.fc = nn.Linear(3, 4)
        self.side = side

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(F.relu(self.bn(self.conv(x))), 1).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.fc(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))


def tiny_embedding_model(dim: int = 2) -> EmbeddingModel:
    torch.manual_seed(0)
    return EmbeddingModel(TinyFeatures(), 3, dim, torch.Generator().manual_seed(1))


def test_the_embedding_head_sits_beside_the_classifier() -> None:
    model = tiny_embedding_model()
    x = torch.rand(5, 3, 2, 2, generator=torch.Generator().manual_seed(0))
    z = model.representation(x)
    assert z.shape == (5, 3 + 2)
    assert torch.equal(model(x), model.base(x))  # the classifier reads the features alone
    outputs, embedding = model.outputs_and_embedding(x)
    assert torch.equal(outputs, model(x)) and torch.equal(embedding, model.mapping(z[:, :3]))


def test_the_label_generator_draws_chunks_of_nl_rows_and_redraws_them_each_round() -> None:
    gen = torch.Generator().manual_seed(0)
    anchors = torch.randn(3, 6, generator=gen)
    generator = LabelGenerator(anchors, nz=4, ngf=2, img_size=8, nc=3, nl=2, batch=5, gen=gen)
    assert len(generator.le1) == 3  # ⌈5 / 2⌉
    images = generator(balanced_targets(5, 3, gen))
    assert images.shape == (5, 3, 8, 8) and images.min() >= 0 and images.max() <= 1
    body = copy.deepcopy(generator.body.state_dict())
    before = generator.le1[0].weight.detach().clone()
    generator.reinit_embedding(gen)
    assert not torch.equal(before, generator.le1[0].weight)
    assert all(torch.equal(body[k], v) for k, v in generator.body.state_dict().items())


def test_the_balanced_targets_cycle_the_classes_then_draw_the_rest() -> None:
    targets = balanced_targets(8, 3, torch.Generator().manual_seed(0))
    assert targets[:6].tolist() == [0, 1, 2, 0, 1, 2] and targets.shape == (8,)
    extra = torch.randint(3, (2,), generator=torch.Generator().manual_seed(0))
    assert targets[6:].tolist() == extra.tolist()


# -- NAYER's synthesis --------------------------------------------------------------------------

NAYER = (
    nayer_defaults(
        synthesis_batch_size=4, g_steps=2, warmup=1, syn_round=2, kd_steps=2,
        sample_batch_size=2, nz=4, ngf=2, classifier="base.fc",
    ),
    NayerOptions(nl=2, image_size=8),
)  # fmt: skip
ANCHORS = torch.tensor([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])


def nayer(seed: int) -> NayerSynthesizer:
    teacher = tiny_embedding_model()
    return NayerSynthesizer(
        teacher, ANCHORS, 3, lambda m, x: m.outputs_and_embedding(x), NAYER, seed
    )


def test_the_generator_loss_is_bn_plus_ce_plus_the_bounding_loss_before_the_adversary() -> None:
    synth = nayer(0)
    synth.ep = 1  # the adversarial term waits for round warmup + 3
    targets = torch.tensor([0, 1, 2, 0])
    inputs = synth.generator(targets).detach()
    state = synth.gen.get_state()
    loss = synth.loss(inputs, targets)
    synth.gen.set_state(state)
    offsets, flips = draw_crop_flip(4, synth.gen)
    x = (crop_flip(inputs, offsets, flips) - 0.5) / 0.2  # the learnt normalisation's start
    outputs, embedding = synth.teacher.outputs_and_embedding(x)
    bn = sum(h.r_feature for h in synth.hooks if h.r_feature is not None)
    assert isinstance(bn, torch.Tensor)
    ce = F.cross_entropy(outputs[:, :3], targets)
    expected = 1.0 * bn + 0.5 * ce + 5.0 * bounding_loss(embedding, ANCHORS[targets], 0.015)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)


def test_the_pool_keeps_syn_round_plus_one_rounds_and_the_same_seed_repeats_it() -> None:
    whole = nayer(3)
    whole.run()
    images, targets = whole.pool()
    assert whole.ep == 3 and images.shape == (3 * 4, 3, 8, 8) and images.dtype == torch.uint8
    assert targets.tolist()[:3] == [0, 1, 2]
    assert not torch.equal(whole.mean, torch.full((3,), 0.5))  # the normalisation learns
    again = nayer(3)
    again.run()
    assert torch.equal(again.pool()[0], images)
    first = nayer(3)
    first.step()
    first.step()
    resumed = nayer(99)
    resumed.load_state_dict(copy.deepcopy(first.state_dict()))
    resumed.run()
    assert torch.equal(resumed.pool()[0], images)
    other = nayer(4)
    other.run()
    assert not torch.equal(other.pool()[0], images)


# -- the client step ----------------------------------------------------------------------------


def lander_learner(tmp_path: Path, side: int = 2) -> tuple[LANDER, FlatModel]:
    path = tmp_path / "anchors.pt"
    torch.save(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]]), path)
    learner = LANDER({"anchors": str(path), "syn_bs": 1})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, side, side), batch_size=4)
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    torch.manual_seed(0)
    model = learner.wrap_model(TinyFeatures())
    return learner, FlatModel(model)


def test_a_step_is_the_codes_weighted_ce_bound_kd_and_embedding_mse(tmp_path: Path) -> None:
    learner, model = lander_learner(tmp_path)
    learner.known_classes = 4  # task 1 of 2 classes each
    teacher = FlatModel(copy.deepcopy(model.module))
    with torch.no_grad():  # the student has moved away from the teacher it received
        cast(EmbeddingModel, teacher.module).mapping.weight.mul_(-2.0)
        cast(EmbeddingModel, teacher.module).base.fc.weight.mul_(3.0)
    pool = torch.randint(0, 256, (6, 3, 2, 2), dtype=torch.uint8, generator=torch.Generator())
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    client.task = 1
    client.train_x = torch.arange(3 * 12, dtype=torch.uint8).reshape(3, 3, 2, 2)
    client.train_y = torch.tensor([2, 3, 2])
    client.decode = lambda x: x.float() / 255
    server = SimpleNamespace(
        global_params=teacher.params.detach(), global_buffers=teacher.buffers.detach(),
        version=1, round_index=3, task=1, is_task_end=False, device=torch.device("cpu"),
    )  # fmt: skip
    broadcast = Broadcast.of(server, {"lander.pool": pool})  # type: ignore[arg-type]
    local = LocalRound(teacher, broadcast)
    inputs = learner.client_inputs(client, local)
    x, y = client.decode(client.train_x[:2]), client.train_y[:2]
    step = StepContext(
        model=model, client=client, broadcast=broadcast, x=x, y=y, task=1, epoch=0,
        offer_to_buffer=False, buffer_batch_size=32, inputs={"lander": inputs},
        keep_representation=True,
    )  # fmt: skip
    loss = engine_loss(model, learner, step)
    # The reference: the walk's first 4 synthetic rows (the client's generator's first
    # permutation of 6), both forwards in training mode apart, the teacher in eval.
    order = torch.randperm(6, generator=torch.Generator().manual_seed(0))[:4]
    s = pool[order].float() / 255
    reference = cast(EmbeddingModel, copy.deepcopy(model.module)).train()
    frozen = cast(EmbeddingModel, copy.deepcopy(teacher.module)).eval()
    out, emb = reference.outputs_and_embedding(x)
    s_out, s_emb = reference.outputs_and_embedding(s)
    with torch.no_grad():
        t_out, t_emb = frozen.outputs_and_embedding(s)
    cur, pre = task_weights(2, 4, 0.2, 0.4)
    expected = cur * current_task_loss(
        out, emb, y, learner.anchors, 2, 2, 5.0, 0.015
    ) + pre * old_task_loss(s_out, t_out, s_emb, t_emb, 2, 2.0)
    assert torch.allclose(loss, expected, rtol=1e-6)


def test_the_pool_walk_cycles_through_the_round_across_epochs() -> None:
    images = torch.arange(5, dtype=torch.uint8).reshape(5, 1, 1, 1)
    gen = torch.Generator().manual_seed(3)
    walk = PoolWalk(images, lambda x: x.float(), gen, torch.device("cpu"), cycle=True)
    rows = []
    for epoch in (0, 0, 1, 1):  # the epoch changes mid-pass: the walk goes on
        batch = walk.at(epoch).sample(2)
        assert batch is not None
        rows.append(batch.x.flatten().long().tolist())
    reference = torch.Generator().manual_seed(3)
    first, second = (torch.randperm(5, generator=reference).tolist() for _ in range(2))
    assert rows == [first[:2], first[2:4], first[4:], second[:2]]


# -- runs ---------------------------------------------------------------------------------------

TINY = "lander:syn_round=1,warmup=1,g_steps=2,synthesis_batch_size=4,kd_steps=2"


@pytest.fixture(scope="module")
def anchors_file(tmp_path_factory: pytest.TempPathFactory, minilm10: torch.Tensor) -> Path:
    path = tmp_path_factory.mktemp("anchors") / "cifar10.pt"
    torch.save(minilm10, path)
    return path


def test_a_run_sends_the_pool_once_in_the_next_task(cifar_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, TINY))  # the MiniLM anchors
    assert code == 0, output
    records = pd.read_csv(out / "records.csv")
    down = records[records.metric == "bytes_down"].value.to_numpy()
    # syn_round + 1 = 2 kept rounds × 4 images of 3×32×32 uint8, to each of the 2 clients
    assert down[1] - down[0] == 2 * (2 * 4) * 3 * 32 * 32


def test_a_crashed_run_resumes_to_the_same_records(
    cifar_root: Path, anchors_file: Path, tmp_path: Path
) -> None:
    # 2 tasks × 2 rounds: round 2 ends task 0 (the synthesis), round 3 is task 1's first
    values = two_task_values(cifar_root, f"{TINY},anchors={anchors_file}")
    assert_config_resumes_after_crash(values, tmp_path, crash_round=3)


@pytest.mark.parametrize(
    ("stream", "extra", "fragment"),
    [
        ("rot-digits", (), "needs a class-incremental stream"),
        ("seq-cifar10", ("--model", "mlp"), "lander inverts the global model's BatchNorm"),
        ("seq-cifar10", ("--executor", "vectorized"), "draw the server's synthetic images"),
        ("seq-cifar10", ("--model", "linear"), "features"),
    ],
)
def test_what_lander_cannot_run_is_refused_in_one_line(
    cifar_root: Path,
    anchors_file: Path,
    tmp_path: Path,
    stream: str,
    extra: tuple[str, ...],
    fragment: str,
) -> None:
    out = tmp_path / "run"
    args = run_args(cifar_root, out, f"{TINY},anchors={anchors_file}", *extra)
    if stream != "seq-cifar10":  # an embedded stream: no data root
        at = args.index("seq-cifar10")
        args[at : at + 3] = [stream]
    code, output = in_process(*args)
    assert code == 2, output
    assert fragment in " ".join(output.split()) and "Traceback" not in output
    assert not (out / "records.csv").exists()


def test_anchors_that_do_not_match_the_streams_classes_are_refused(
    cifar_root: Path, tmp_path: Path
) -> None:
    path = tmp_path / "seven.pt"
    torch.save(torch.zeros(7, 4), path)
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, f"{TINY},anchors={path}"))
    assert code == 2, output
    assert "have 7 rows but the stream has 10 classes" in " ".join(output.split())


# The Flower executor's refusal: tests/test_target.py (parametrized over both).


def test_lander_is_listed_with_its_options() -> None:
    code, output = in_process("list", "strategies")
    assert code == 0 and "lander" in output and "Tran et al., CVPR 2024" in " ".join(output.split())


def test_the_synthesis_is_priced_in_steps_by_kind_and_off_on_the_probe_copy(
    tmp_path: Path,
) -> None:
    learner, model = lander_learner(tmp_path, side=8)
    learner.opts = dataclasses.replace(learner.opts, synthesis_batch_size=4)
    work = learner.extra_work().task_end_server
    assert work is not None
    # The code's schedule: 50 rounds of 40 generator steps; the adversarial term from round
    # 13 on (12 rounds without), 50 KD steps after each round from round 10 on (41 rounds).
    kinds = work(model.module)
    assert [n for n, _ in kinds] == [12 * 40.0, 38 * 40.0, 41 * 50.0]
    for _, unit in reversed(kinds):
        unit()  # one step of each kind on a copy of the model; the KD step makes its pool
    learner.opts = dataclasses.replace(learner.opts, syn_round=2, warmup=1, g_steps=1)
    # 3 rounds: none reaches warmup + 3; all 3 from warmup on end with 50 KD steps.
    assert [n for n, _ in work(model.module)] == [3.0, 150.0]
    learner.probe_copy()
    assert not learner.synthesizes


def test_minilm_anchors_without_the_runs_encoder_are_refused() -> None:
    with pytest.raises(UserError, match="needs the sentence encoder, which this run does not"):
        load_anchors("minilm", "seq-cifar10", 10)


# -- the code's best_model ----------------------------------------------------------------------


def best_model_server(round_index: int, params: float, task_end: bool) -> SimpleNamespace:
    """The server's view the best-model hooks read: θ_g (all ``params``), one buffer."""
    return SimpleNamespace(
        round_index=round_index,
        task=0,
        global_params=torch.full((3,), params),
        global_buffers=torch.full((1,), -params),
        is_task_end=task_end,
    )


def test_the_task_end_model_is_the_round_start_with_the_lowest_summed_loss(
    tmp_path: Path,
) -> None:
    """Three rounds of a task start from θ_g = 1, 2, 3; their clients' first-epoch losses
    sum to 5, 3 and 3: round 2's start (the first of the two lowest, the code's strict <)
    becomes θ_g after the task's last aggregation; the next task starts over."""
    learner, _ = lander_learner(tmp_path)
    learner.synthesizes = False  # no synthesis: the probe's copy
    sums = {1: (2.0, 3.0), 2: (1.0, 2.0), 3: (1.5, 1.5)}
    for round_index, losses in sums.items():
        server = best_model_server(round_index, float(round_index), task_end=round_index == 3)
        for client, loss in enumerate(losses):
            upload = SimpleNamespace(client=client, extras={"lander.loss": torch.tensor([loss])})
            learner.receive_upload(upload, server)  # type: ignore[arg-type]
        server.global_params = torch.full((3,), 10.0 * round_index)  # the round's average
        learner.after_aggregate(server)  # type: ignore[arg-type]
    assert torch.equal(server.global_params, torch.full((3,), 2.0))
    assert torch.equal(server.global_buffers, torch.full((1,), -2.0))
    assert learner.best.lowest == math.inf and learner.best.params is None
    # The option off: the last average stays.
    learner.opts = dataclasses.replace(learner.opts, best_model=False)
    server = best_model_server(4, 4.0, task_end=True)
    server.global_params = torch.full((3,), 40.0)
    learner.after_aggregate(server)  # type: ignore[arg-type]
    assert torch.equal(server.global_params, torch.full((3,), 40.0))


def test_a_client_uploads_its_first_epochs_summed_loss(tmp_path: Path) -> None:
    learner, model = lander_learner(tmp_path)
    client = ClientState(index=0, generator=torch.Generator(), buffer=None)
    broadcast = cast(Broadcast, SimpleNamespace(device=torch.device("cpu")))
    local = LocalRound(model, broadcast, first_epoch_loss=torch.tensor(7.5))
    upload = SimpleNamespace(extras={})
    learner.after_local(client, upload, local)  # type: ignore[arg-type]
    assert torch.equal(upload.extras["lander.loss"], torch.tensor([7.5]))
    learner.opts = dataclasses.replace(learner.opts, best_model=False)
    upload = SimpleNamespace(extras={})
    learner.after_local(client, upload, local)  # type: ignore[arg-type]
    assert upload.extras == {}
