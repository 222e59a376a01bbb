"""MFCL: its losses (``strategies.mfcl_loss``) against values computed by hand from the
equations of its official code (clients/helper.py, clients/MFCL.py), the generator's
training against a recomputation on a tiny model, a client step through the engine's joint
plan, its defaults, a tiny run, its resume and its refusals."""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from PIL import Image
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.context import Broadcast, ClientState, LocalRound, StepContext
from cfl_bench.core.flat import FlatModel
from cfl_bench.leaderboard.report import build_report
from cfl_bench.strategies.declarations import MFCLOptions
from cfl_bench.strategies.mfcl import MFCL, flat_state
from cfl_bench.strategies.mfcl_loss import (
    CONTENT_TEMPERATURE,
    bn_divergence,
    client_loss,
    content_loss,
    generator_loss,
    information_entropy_loss,
    smoothing_kernel,
    smoothness_loss,
)
from cfl_bench.strategies.replay import head_cross_entropy, head_distillation
from cfl_bench.strategies.synthesis_mfcl import CodeGenerator, MFCLSynthesizer
from tests import data_free_runs
from tests.data_free_runs import engine_loss, run_args, two_task_values
from tests.helpers import env
from tests.test_cli import in_process
from tests.test_resume import assert_config_resumes_after_crash

# The tiny CIFAR-10 folder (a module fixture shared with the other data-free learners).
cifar_root = data_free_runs.cifar_root

LN3 = math.log(3.0)
TINY = "mfcl:pi=2,server_ss=4,z_dim=4,syn_size=4"
# The tiny generator (z_dim 4, 3×32×32): l1 4·8192 + 8192, BN(128) 4·128, conv 128·128·9 +
# 128, BN(128) 4·128, conv 128·64·9 + 64, BN(64) 4·64, conv 64·3·9 + 3, BN(3) running 2·3.
TINY_GENERATOR_FLOATS = 40960 + 512 + 147584 + 512 + 73792 + 256 + 1731 + 6


class FeatureNet(nn.Module):
    """conv 1×1 → BatchNorm → global pool (the representation) → linear head of 4."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.bn, self.head = nn.Conv2d(3, 2, 1), nn.BatchNorm2d(2), nn.Linear(2, 4)

    def representation(self, x: torch.Tensor) -> torch.Tensor:
        return F.adaptive_avg_pool2d(self.bn(self.conv(x)), 1).flatten(1)

    def classify(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(z)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classify(self.representation(x))


def feature_net(seed: int = 0) -> FeatureNet:
    torch.manual_seed(seed)
    net = FeatureNet()
    net.bn.running_mean.copy_(torch.tensor([0.1, -0.2]))
    net.bn.running_var.copy_(torch.tensor([0.5, 2.0]))
    return net


def test_the_bn_divergence_is_the_codes_gaussian_kl_per_channel() -> None:
    # running (0, 1), batch (1, 4): log(2/1) − ½(1 − (1 + 1)/4) = ln 2 − ¼ (floor 1e−8 aside)
    value = bn_divergence(torch.zeros(1), torch.ones(1), torch.ones(1), torch.full((1,), 4.0))
    assert math.isclose(value.item(), math.log(2.0) - 0.25, rel_tol=1e-6)
    # equal statistics: 0; two channels average
    same = bn_divergence(torch.zeros(2), torch.ones(2), torch.zeros(2), torch.ones(2))
    assert abs(same.item()) < 1e-7


def test_the_content_and_entropy_terms_by_hand() -> None:
    # CE at T = 1e3 against the argmax: logits (1000 ln 3, 0) → softmax (¾, ¼) → ln 4/3
    outputs = torch.tensor([[CONTENT_TEMPERATURE * LN3, 0.0]])
    assert math.isclose(content_loss(outputs).item(), math.log(4 / 3), rel_tol=1e-6)
    # mean softmax (½, ½): 0; (¾, ¼): 1 − H(¾, ¼)/ln 2
    even = torch.tensor([[LN3, 0.0], [0.0, LN3]])
    assert abs(information_entropy_loss(even).item()) < 1e-6
    skewed = torch.tensor([[LN3, 0.0], [LN3, 0.0]])
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    expected = 1 - entropy / math.log(2)
    assert math.isclose(information_entropy_loss(skewed).item(), expected, rel_tol=1e-6)


def test_the_smoothing_is_the_codes_kernel_and_its_prior_by_hand() -> None:
    kernel = smoothing_kernel(3)
    assert kernel.shape == (3, 1, 5, 5) and math.isclose(kernel[0].sum().item(), 1.0, rel_tol=1e-6)
    # the code's exponent −((i − 2)/(2σ))²: the centre over the edge of the middle row is e
    assert math.isclose((kernel[0, 0, 2, 2] / kernel[0, 0, 2, 0]).item(), math.e, rel_tol=1e-6)
    axis = torch.tensor([math.exp(-(((i - 2) / 2) ** 2)) for i in range(5)])
    k = torch.outer(axis, axis) / torch.outer(axis, axis).sum()
    # a delta in the middle of a 9×9 image: blurred = k around it (the reflection adds none)
    delta = torch.zeros(1, 1, 9, 9)
    delta[0, 0, 4, 4] = 1.0
    expected = (((1 - k[2, 2]) ** 2 + (k**2).sum() - k[2, 2] ** 2) / 81).item()
    assert math.isclose(smoothness_loss(delta, kernel[:1]).item(), expected, rel_tol=1e-5)
    assert smoothness_loss(torch.ones(2, 3, 8, 8), kernel).item() < 1e-12


def test_the_generator_loss_weighs_its_four_terms() -> None:
    outputs = torch.tensor([[LN3, 0.0], [LN3, 0.0]])
    images = torch.rand(2, 3, 6, 6, generator=torch.Generator().manual_seed(0))
    kernel = smoothing_kernel(3)
    divergences = [torch.tensor(0.2), torch.tensor(0.6)]
    value = generator_loss(outputs, divergences, images, kernel, (2.0, 50.0, 1e-3))
    expected = (
        content_loss(outputs)
        + 2.0 * information_entropy_loss(outputs)
        + 50.0 * (0.2 + 0.6) / 2
        + 1e-3 * smoothness_loss(images, kernel)
    )
    assert torch.allclose(value, expected)


def test_the_client_terms_by_hand() -> None:
    # the old head on the student's features against the teacher's: rows Σ (1 + 4), 0 → ½·5 / 2
    student_old, teacher_old = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.zeros(2, 2)
    assert math.isclose(head_distillation(student_old, teacher_old).item(), 1.25)
    # the head's CE over the leading 2 outputs: softmax(ln 3, 0) at label 0 → ln 4/3
    head = torch.tensor([[LN3, 0.0, 9.0]])
    value = head_cross_entropy(head, torch.tensor([0]), 2).item()
    assert math.isclose(value, math.log(4 / 3), rel_tol=1e-6)
    # the whole step: new-class CE on the real row's outputs 2..3, + w_ft · head + w_kd · kd
    outputs = torch.tensor([[9.0, 9.0, 0.0, LN3], [0.0, 0.0, 0.0, 0.0]])
    y = torch.tensor([3, 0])
    head_out = torch.tensor([[0.0, 0.0, 0.0, 0.0], [LN3, 0.0, 0.0, 0.0]])
    value = client_loss(outputs, head_out, y, (student_old, teacher_old), 1, 2, 2, (2.0, 0.1))
    ce_head = (math.log(4) + math.log(2)) / 2  # uniform over 4; (3, 1, 1, 1)/6 at label 0
    expected = math.log(4 / 3) + 2.0 * ce_head + 0.1 * 1.25
    assert math.isclose(value.item(), expected, rel_tol=1e-6)


def test_a_generator_step_is_the_codes_loss_and_an_adam_step() -> None:
    teacher = feature_net().eval()
    before = copy.deepcopy(teacher.state_dict())
    generator = CodeGenerator(4, 3, 4, torch.Generator().manual_seed(1))
    reference = copy.deepcopy(generator)
    settings = (1, 5, 1e-3, (1.0, 50.0, 1e-3))
    synthesizer = MFCLSynthesizer(teacher, generator, 3, settings, seed=7)
    loss = synthesizer.step()
    # the recomputation: the same z, the teacher's BatchNorm input, the code's formulas
    reference.train()
    z = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))
    images = reference(z)
    hidden = teacher.conv(images)
    mean, var = hidden.mean(dim=(0, 2, 3)), hidden.var(dim=(0, 2, 3), unbiased=False) + 1e-8
    rm, rv = teacher.bn.running_mean, teacher.bn.running_var + 1e-8
    r = torch.log(var.sqrt() / rv.sqrt()).mean() - 0.5 * (1 - (rv + (rm - mean) ** 2) / var).mean()
    out = teacher(images)[:, :3]
    p = F.softmax(out, dim=1).mean(dim=0)
    ie = 1 + (p * torch.log(p)).sum() / math.log(3)
    ce = F.cross_entropy(out / 1000, out.argmax(dim=1))
    blurred = F.conv2d(F.pad(images, (2, 2, 2, 2), mode="reflect"), smoothing_kernel(3), groups=3)
    expected = ce + ie + 50.0 * r + 1e-3 * F.mse_loss(images, blurred)
    assert math.isclose(loss, expected.item(), rel_tol=1e-5)
    optimizer = torch.optim.Adam(reference.parameters(), lr=1e-3)
    optimizer.zero_grad()
    expected.backward()
    optimizer.step()
    # (the biases that feed a BatchNorm have no gradient but rounding noise, whose sign is
    # all Adam's first step reads: they are left out)
    no_gradient = {"l1.0.bias", "conv_blocks1.0.bias", "conv_blocks2.0.bias"}
    theirs = reference.state_dict()
    for name, mine in generator.state_dict().items():
        if name not in no_gradient:
            assert torch.allclose(mine, theirs[name], atol=1e-6), name
    synthesizer.close()
    assert not generator.training
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())


def test_the_options_default_to_the_official_codes_values() -> None:
    o = MFCLOptions()
    # utiles.py:91, 102, 103, 92, 93, 94, 95, 101, 106, 105
    assert (o.syn_size, o.w_kd, o.w_ft, o.server_ss, o.pi) == (128, 0.1, 1.0, 128, 100)
    assert (o.generator_lr, o.z_dim, o.w_ie, o.w_bn, o.w_noise) == (1e-3, 1000, 1.0, 50.0, 1e-3)
    generator = CodeGenerator(1000, 3, 32, torch.Generator().manual_seed(0))
    # CIFAR_GEN: Linear(1000 → 128·8·8), convs 128→128→64→3, BN eps 0.8 in two blocks
    params = 1000 * 8192 + 8192 + 2 * 128 + 128 * 128 * 9 + 128 + 2 * 128
    params += 128 * 64 * 9 + 64 + 2 * 64 + 64 * 3 * 9 + 3
    assert sum(p.numel() for p in generator.parameters()) == params
    assert [m.eps for m in generator.modules() if isinstance(m, nn.BatchNorm2d)] == [
        1e-5,
        0.8,
        0.8,
        1e-5,
    ]


def mfcl_client(learner: MFCL, teacher: FlatModel) -> tuple:
    """A task-1 client of 3 examples (4×4 images) whose task-1 teacher is ``teacher``."""
    client = ClientState(index=0, generator=torch.Generator().manual_seed(0), buffer=None)
    client.task = 1
    client.train_x = torch.arange(3 * 48, dtype=torch.uint8).reshape(3, 3, 4, 4)
    client.train_y = torch.tensor([2, 3, 2])
    client.decode = lambda x: x.float() / 255
    server = SimpleNamespace(
        global_params=teacher.params.detach(),
        global_buffers=teacher.buffers.detach(),
        version=1,
        round_index=3,
        task=1,
        is_task_end=False,
        device=torch.device("cpu"),
    )
    broadcast = Broadcast.of(server, {})  # type: ignore[arg-type]
    local = LocalRound(teacher, broadcast)
    return client, local, learner.client_inputs(client, local)


def test_a_step_is_the_codes_train_cl_on_the_joined_batch() -> None:
    learner = MFCL({"syn_size": 3, "z_dim": 4})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, 4, 4))
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    learner.known_classes, learner.generator_task, learner.delivered = 4, 1, [0]
    teacher = FlatModel(feature_net(0))
    learner.teacher_net = FlatModel(copy.deepcopy(teacher.module).eval())
    model = FlatModel(feature_net(1))  # the student has moved away from its teacher
    client, local, inputs = mfcl_client(learner, teacher)
    x = client.decode(client.train_x[:2])
    step = StepContext(
        model=model,
        client=client,
        broadcast=local.broadcast,
        x=x,
        y=client.train_y[:2],
        task=1,
        epoch=0,
        offer_to_buffer=False,
        buffer_batch_size=32,
        inputs={"mfcl": inputs},
    )
    reference = copy.deepcopy(model.module).train()
    loss = engine_loss(model, learner, step)
    # The reference: 3 generated rows (z from the client's generator), labelled by the
    # teacher over the 2 old classes, joined to the batch; a second forward without gradient
    generator = learner.generator().eval()
    frozen = copy.deepcopy(teacher.module).eval()
    with torch.no_grad():
        synthetic = generator(torch.randn(3, 4, generator=torch.Generator().manual_seed(0)))
        y_syn = frozen(synthetic)[:, :2].argmax(dim=1)
    x_all, y_all = torch.cat([x, synthetic]), torch.cat([torch.tensor([2, 3]), y_syn])
    z = reference.representation(x_all)
    with torch.no_grad():
        head = reference.classify(reference.representation(x_all))
        teacher_z = frozen.representation(x_all)
    old = (frozen.classify(z)[:, :2], frozen.classify(teacher_z)[:, :2])
    expected = client_loss(reference.classify(z), head, y_all, old, 2, 2, 2, (1.0, 0.1))
    assert torch.allclose(loss, expected, rtol=1e-6)
    # BatchNorm's running statistics moved twice, as the code's two training-mode forwards
    assert torch.allclose(model.module.bn.running_mean, reference.bn.running_mean)
    assert torch.allclose(model.module.bn.running_var, reference.bn.running_var)


def test_a_run_sends_the_generator_once_in_the_next_task(cifar_root: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    code, output = in_process(*run_args(cifar_root, out, TINY))
    assert code == 0, output
    records = pd.read_csv(out / "records.csv")
    down = records[records.metric == "bytes_down"].value.to_numpy()
    generator = CodeGenerator(4, 3, 32, torch.Generator())
    assert flat_state(generator).numel() == TINY_GENERATOR_FLOATS
    # the generator's float32 state to each of the 2 clients, on top of the model
    assert down[1] - down[0] == 2 * TINY_GENERATOR_FLOATS * 4
    with Image.open(out / "synthetic-images" / "after-task-1.png") as grid:
        # one row of up to 8 per class the teacher gives the 32 images
        rows = len(grid.info["classes"].split(","))
        assert grid.size == (8 * 32 + 7, rows * 32 + rows - 1)
    page, _ = build_report(str(out))
    html = page.read_text()
    assert 'id="synthetic-after-task-1"' in html and "data:image/png;base64," in html


@pytest.mark.parametrize("crash_round", [1, 2])
def test_a_crashed_run_resumes_to_the_same_records(
    cifar_root: Path, tmp_path: Path, crash_round: int
) -> None:
    # 2 tasks × 2 rounds: round 2 ends task 0 (the generator's training), round 3 is task 1's
    values = two_task_values(cifar_root, TINY)
    assert_config_resumes_after_crash(values, tmp_path, crash_round=crash_round + 1)


@pytest.mark.parametrize(
    ("stream", "extra", "fragment"),
    [
        ("rot-digits", (), "needs a class-incremental stream"),
        ("seq-cifar10", ("--model", "mlp"), "lacks; use --model"),
        ("seq-cifar10", ("--executor", "vectorized"), "MFCL's clients draw"),
    ],
)
def test_what_mfcl_cannot_run_is_refused_in_one_line(
    cifar_root: Path, tmp_path: Path, stream: str, extra: tuple[str, ...], fragment: str
) -> None:
    out = tmp_path / "run"
    args = run_args(cifar_root, out, TINY, *extra)
    if "--model" in extra:
        at = args.index("cifar-cnn")
        del args[at - 1 : at + 1]
    if stream != "seq-cifar10":  # an embedded stream: no data root
        at = args.index("seq-cifar10")
        args[at : at + 3] = [stream]
    code, output = in_process(*args)
    assert code == 2, output
    assert fragment in " ".join(output.split()) and "Traceback" not in output
    assert not (out / "records.csv").exists()


def test_the_generator_training_is_priced_in_pi_units_and_off_on_the_probe_copy() -> None:
    learner = MFCL({"pi": 3, "server_ss": 2, "z_dim": 4})
    facts = env("seq-cifar10", "class-il", 4, 2, input_shape=(3, 4, 4))
    learner.setup(dataclasses.replace(facts, classes_per_task=2))
    work = learner.extra_work().task_end_server
    assert work is not None
    ((units, unit),) = work(feature_net())
    assert units == 3.0
    unit()  # one generator step on a copy of the model
    learner.probe_copy()
    assert not learner.synthesizes
