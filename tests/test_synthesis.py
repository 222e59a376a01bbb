"""The data-free synthesis engine (strategies.synthesis, strategies.synthesis_parts): each
loss on hand-made tensors against values computed by hand, the generator and its reset, the
augmentation, the pool's selection, and an end-to-end synthesis from a small trained teacher
(it must make images the teacher reads as their requested classes, reproducibly, and a
resumed synthesis must equal an uninterrupted one).
"""

from __future__ import annotations

import io
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from cfl_bench.core.errors import UserError
from cfl_bench.strategies.synthesis import SynthesisOptions, Synthesizer, kept_indices
from cfl_bench.strategies.synthesis_parts import (
    BNStatHook,
    Generator,
    adversarial_loss,
    crop_flip,
    draw_crop_flip,
    kldiv,
    normalize,
    reset_first_layers,
)


def _bn_layer() -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(2).eval()
    assert bn.running_mean is not None and bn.running_var is not None
    bn.running_mean.copy_(torch.tensor([0.0, 1.0]))
    bn.running_var.copy_(torch.tensor([1.0, 2.0]))
    return bn


def _input() -> torch.Tensor:
    """2×2×2×2: channel 0 is 1 in image 0 and 3 in image 1 (mean 2, biased var 1); channel 1
    is 0 except image 1's bottom row of 4s (mean 1, E[x²] = 32/8 = 4, var 3)."""
    x = torch.zeros(2, 2, 2, 2)
    x[0, 0], x[1, 0] = 1.0, 3.0
    x[1, 1, 1] = 4.0
    return x


def test_the_bn_statistics_loss_is_the_sum_of_two_l2_norms() -> None:
    """‖[1, 2] − [1, 3]‖ + ‖[0, 1] − [2, 1]‖ = 1 + 2 = 3."""
    bn = _bn_layer()
    hook = BNStatHook(bn, mmt_rate=0.9)
    bn(_input())
    assert hook.r_feature is not None
    assert hook.r_feature.item() == pytest.approx(3.0, abs=1e-6)


def test_the_momentum_form_blends_the_batch_statistics_with_earlier_rounds() -> None:
    """With (μ̄, v̄) = ([0, 0], [1, 1]) and m = 0.9: μ = 0.1·[2, 1] = [0.2, 0.1],
    v = 0.1·[1, 3] + 0.9·[1, 1] = [1, 1.2]; ‖[1, 2] − [1, 1.2]‖ + ‖[0, 1] − [0.2, 0.1]‖ =
    0.8 + √0.85."""
    bn = _bn_layer()
    hook = BNStatHook(bn, mmt_rate=0.9)
    hook.mmt = (torch.zeros(2), torch.ones(2))
    bn(_input())
    assert hook.r_feature is not None
    assert hook.r_feature.item() == pytest.approx(0.8 + math.sqrt(0.85), abs=1e-6)


def test_update_mmt_keeps_then_blends_the_last_statistics() -> None:
    """Step 1 keeps ([2, 1], [1, 3]). Step 2 sees channel 0 ≡ 0, channel 1 ≡ 2 (μ [0, 2],
    σ² [0, 0]): its loss blends μ = 0.1·[0, 2] + 0.9·[2, 1] = [1.8, 1.1], v = 0.9·[1, 3] =
    [0.9, 2.7], so √(0.01 + 0.49) + √(3.24 + 0.01); the momentum becomes those same values."""
    bn = _bn_layer()
    hook = BNStatHook(bn, mmt_rate=0.9)
    bn(_input())
    hook.update_mmt()
    assert hook.mmt is not None
    assert torch.allclose(hook.mmt[0], torch.tensor([2.0, 1.0]))
    assert torch.allclose(hook.mmt[1], torch.tensor([1.0, 3.0]))
    second = torch.zeros(2, 2, 2, 2)
    second[:, 1] = 2.0
    bn(second)
    assert hook.r_feature is not None
    assert hook.r_feature.item() == pytest.approx(math.sqrt(0.5) + math.sqrt(3.25), abs=1e-6)
    hook.update_mmt()
    assert torch.allclose(hook.mmt[0], torch.tensor([1.8, 1.1]))
    assert torch.allclose(hook.mmt[1], torch.tensor([0.9, 2.7]))


def test_kldiv_is_batchmean_kl_times_t_squared() -> None:
    """Row 0: teacher p = [3/4, 1/4], student q = [1/2, 1/2]: KL = ¾ ln 1.5 + ¼ ln 0.5 =
    0.130812036; row 1 agrees (KL 0); batchmean halves it; at T = 20 the logits are ×20 so the
    probabilities are the same and the loss is ×400."""
    kl = 0.75 * math.log(1.5) + 0.25 * math.log(0.5)
    student = torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    teacher = torch.tensor([[math.log(3.0), 0.0], [1.0, 1.0]])
    assert kldiv(student, teacher).item() == pytest.approx(kl / 2, abs=1e-6)
    hot = kldiv(student, 20 * teacher, temperature=20.0).item()
    assert hot == pytest.approx(400 * kl / 2, rel=1e-5)
    assert hot == pytest.approx(26.1624072, rel=1e-5)


def test_the_adversarial_term_counts_only_rows_where_both_argmaxes_agree() -> None:
    """Row 0 agrees: KL([¾, ¼] ‖ [0.6, 0.4]) = ¾ ln 1.25 + ¼ ln 0.625 = 0.049856752; row 1
    disagrees (masked out); row 2 agrees with KL 0; the mean is over all three rows."""
    teacher = torch.tensor([[math.log(3.0), 0.0], [math.log(3.0), 0.0], [0.0, math.log(3.0)]])
    student = torch.tensor([[math.log(1.5), 0.0], [0.0, math.log(3.0)], [0.0, math.log(3.0)]])
    loss, mask = adversarial_loss(student, teacher)
    assert mask.tolist() == [1.0, 0.0, 1.0]
    expected = -(0.75 * math.log(1.25) + 0.25 * math.log(0.625)) / 3
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert loss.item() == pytest.approx(-0.016618917, abs=1e-7)


def test_the_generator_makes_images_in_the_unit_range() -> None:
    gen = torch.Generator().manual_seed(0)
    generator = Generator(nz=100, ngf=64, img_size=32, nc=3, gen=gen)
    images = generator(torch.randn(4, 100, generator=gen))
    assert images.shape == (4, 3, 32, 32)
    assert images.min().item() >= 0.0 and images.max().item() <= 1.0
    assert generator.l1[0].weight.shape == (128 * 8 * 8, 100)
    with pytest.raises(UserError, match="divisible by 4"):
        Generator(nz=8, ngf=8, img_size=30, nc=3)


def test_reset_l0_reinitialises_exactly_the_linear_and_the_first_batchnorm() -> None:
    gen = torch.Generator().manual_seed(1)
    generator = Generator(nz=16, ngf=8, img_size=8, nc=3, gen=gen)
    with torch.no_grad():
        for p in generator.parameters():
            p.add_(1.0)
    before = {k: v.clone() for k, v in generator.state_dict().items()}
    reset_first_layers(generator, gen)
    after = generator.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed == {"l1.0.weight", "l1.0.bias", "conv_blocks.0.weight", "conv_blocks.0.bias"}
    assert torch.count_nonzero(after["l1.0.bias"]) == 0
    assert torch.count_nonzero(after["conv_blocks.0.bias"]) == 0
    assert after["conv_blocks.0.weight"].abs().max().item() < 0.1  # N(0, 0.02), not ≈ 1


def test_the_augmentation_is_a_differentiable_whole_pixel_crop_and_flip() -> None:
    x = torch.arange(2 * 3 * 8 * 8, dtype=torch.float32).reshape(2, 3, 8, 8).requires_grad_()
    centre = torch.tensor([[4, 4], [4, 4]])
    assert torch.equal(crop_flip(x, centre, torch.tensor([False, False])), x)
    flipped = crop_flip(x, centre, torch.tensor([True, False]))
    assert torch.equal(flipped[0], x[0].flip(-1)) and torch.equal(flipped[1], x[1])
    corner = crop_flip(x, torch.tensor([[0, 0], [8, 8]]), torch.tensor([False, False]))
    assert torch.equal(corner[0, :, 4:, 4:], x[0, :, :4, :4])
    assert torch.count_nonzero(corner[0, :, :4]) == 0 and torch.count_nonzero(corner[1, :, 4:]) == 0
    corner.sum().backward()
    assert x.grad is not None
    expected = torch.zeros(2, 3, 8, 8)
    expected[0, :, :4, :4] = 1.0
    expected[1, :, 4:, 4:] = 1.0
    assert torch.equal(x.grad, expected)


def test_the_augmentation_draws_repeat_under_the_same_seed() -> None:
    first = draw_crop_flip(64, torch.Generator().manual_seed(5))
    second = draw_crop_flip(64, torch.Generator().manual_seed(5))
    other = draw_crop_flip(64, torch.Generator().manual_seed(6))
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])
    assert not torch.equal(first[0], other[0])
    assert first[0].min().item() == 0 and first[0].max().item() == 8


def test_the_kd_reads_the_first_names_in_sorted_order() -> None:
    """Pool images are named "round-index.png": "0-10.png" sorts before "0-2.png"."""
    assert kept_indices(12, 11, 5).tolist() == [0, 1, 10, 2, 3]
    assert kept_indices(4, 4, 8000).tolist() == [0, 1, 2, 3]


def test_the_defaults_are_the_official_codes() -> None:
    """target.py lines 24–42 (the CIFAR-100 branch, the one its line 21 selects), 575, 581,
    598, 600; main.py's --nums."""
    o = SynthesisOptions()
    assert (o.synthesis_batch_size, o.sample_batch_size, o.g_steps, o.kd_steps) == (
        256,
        256,
        10,
        400,
    )
    assert (o.is_maml, o.warmup, o.syn_round, o.reset_l0, o.nums) == (True, 20, 10, True, 8000)
    assert (o.lr_g, o.lr_z, o.oh, o.temperature, o.adv, o.bn, o.bn_mmt) == (
        0.002,
        0.01,
        0.5,
        20.0,
        1.0,
        10.0,
        0.9,
    )
    assert (o.nz, o.ngf, o.kd_lr, o.kd_weight_decay, o.kd_cosine_rounds) == (
        256,
        64,
        0.2,
        1e-4,
        200,
    )
    with pytest.raises(UserError, match="bn_mmt"):
        SynthesisOptions(bn_mmt=1.0)


# -- end to end -------------------------------------------------------------------------------

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


class TinyTeacher(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.conv2, self.bn2 = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
        self.fc = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn1(self.conv1(x)))
        return self.fc(F.relu(self.bn2(self.conv2(x))).mean(dim=(2, 3)))


def _trained_teacher() -> TinyTeacher:
    """Three classes of 8×8 RGB noise, class c with channel c bright: separable however
    cropped or flipped. Trained with the engine's crop/flip and normalisation, as TARGET's
    model is trained with RandomCrop(padding 4) and flips."""
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    teacher = TinyTeacher()
    optimizer = torch.optim.SGD(teacher.parameters(), lr=0.1, momentum=0.9)
    for _ in range(60):
        y = torch.randint(0, 3, (64,), generator=gen)
        x = 0.4 * torch.rand(64, 3, 8, 8, generator=gen)
        x[torch.arange(64), y] += 0.5
        offsets, flips = draw_crop_flip(64, gen)
        loss = F.cross_entropy(teacher(normalize(crop_flip(x, offsets, flips), MEAN, STD)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return teacher.eval()


# Small and quick; bn = oh = 1 and lr_z 0.1 instead of the code's 10 / 0.5 / 0.01, because
# this tiny teacher's confident logits make the CE large next to L_BN and 40 steps are few.
OPTIONS = SynthesisOptions(
    nz=16,
    ngf=8,
    synthesis_batch_size=48,
    sample_batch_size=16,
    g_steps=40,
    lr_g=0.01,
    lr_z=0.1,
    bn=1.0,
    oh=1.0,
    warmup=2,
    kd_steps=4,
    syn_round=4,
    mean=MEAN,
    std=STD,
)


@pytest.fixture(scope="module")
def teacher() -> TinyTeacher:
    return _trained_teacher()


def test_synthesis_makes_images_the_teacher_reads_as_their_classes(teacher: TinyTeacher) -> None:
    synthesizer = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=0)
    traces = [synthesizer.step() for _ in range(OPTIONS.syn_round)]
    images, targets = synthesizer.pool()
    assert images.dtype == torch.uint8 and images.shape == (4 * 48, 3, 8, 8)
    with torch.no_grad():
        predicted = teacher(normalize(images.float() / 255, MEAN, STD)).argmax(dim=1)
    accuracy = (predicted == targets).float().mean().item()
    # chance is 1/3; the last round's images are pushed by the adversarial term towards the
    # student's disagreements (the code's design), so the pool as a whole is asked for.
    assert accuracy > 0.7, accuracy
    assert traces[0].bn[-1] < traces[0].bn[0]
    assert traces[-1].bn[-1] < traces[0].bn[0]
    assert all(a == 0.0 for a in traces[0].adv) and traces[2].adv != [0.0] * 40


def test_the_same_seed_gives_the_same_pool_and_a_resumed_synthesis_continues_it(
    teacher: TinyTeacher,
) -> None:
    whole = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=3)
    whole.run()
    again = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=3)
    again.run()
    assert torch.equal(whole.pool()[0], again.pool()[0])
    first = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=3)
    first.step()
    first.step()
    first.step()  # past the warm-up: the adversarial term and one KD round have run
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    resumed = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=99)
    resumed.load_state_dict(torch.load(buffer, weights_only=False))
    resumed.run()
    assert resumed.ep == 4
    assert torch.equal(whole.pool()[0], resumed.pool()[0])
    assert torch.equal(whole.pool()[1], resumed.pool()[1])
    for key, value in whole.student.state_dict().items():
        assert torch.equal(value, resumed.student.state_dict()[key]), key
    other = Synthesizer(teacher, 3, (3, 8, 8), OPTIONS, seed=4)
    other.run()
    assert not torch.equal(whole.pool()[0], other.pool()[0])
