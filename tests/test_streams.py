"""Streams, their batched transforms, the embedded digits and the stream registry."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from cfl_bench.core.errors import UserError
from cfl_bench.streams.base import Stream
from cfl_bench.streams.digits import digits_images, load_digits
from cfl_bench.streams.domain_il import PermutedStream, RotatedStream
from cfl_bench.streams.mnist import load_mnist
from cfl_bench.streams.registry import STREAMS, build_stream
from cfl_bench.streams.transforms import permute_pixels, rotate_batch
from tests.synthetic_data import write_tiny_mnist

CPU = torch.device("cpu")
Rotate = Callable[[torch.Tensor, float], torch.Tensor]


@pytest.fixture(scope="module")
def tv_rotate() -> Rotate:
    """torchvision's tensor rotate, the reference our batched rotation must reproduce.

    A torchvision wheel built for another torch variant (e.g. a CUDA build beside a CPU-only
    torch) raises RuntimeError, not ImportError, on import; report that instead of failing.
    """
    try:
        from torchvision.transforms.v2.functional import rotate
    except Exception as exc:
        pytest.skip(f"torchvision cannot be imported here ({type(exc).__name__}: {exc})")
    return rotate


MNIST_TRAIN, MNIST_TEST = 600, 200  # the synthetic MNIST files below


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding MNIST-format files (random pixels): the streams only need the format."""
    root = tmp_path_factory.mktemp("mnist-format")
    write_tiny_mnist(root, gz=True, n_train=MNIST_TRAIN, n_test=MNIST_TEST)
    return root


@pytest.fixture(scope="module")
def mnist_floats(mnist_root: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """All train and test images of ``mnist_root``, untransformed, as floats in [0, 1]."""
    train_x, _, test_x, _ = load_mnist(mnist_root, download=False)
    return train_x.unsqueeze(1).float() / 255, test_x.unsqueeze(1).float() / 255


def mnist_stream(root: Path, name: str = "rot-mnist", seed: int = 0, **sizes: int) -> Stream:
    sizes = {"train_size": 500, "test_size": 200, **sizes}
    return build_stream(
        name, num_tasks=3, seed=seed, device=CPU, data_root=str(root), download=False, **sizes
    )


def digits_stream(name: str = "rot-digits", seed: int = 0, num_tasks: int = 3) -> Stream:
    return build_stream(
        name, num_tasks=num_tasks, seed=seed, device=CPU, data_root=None, download=False
    )


# --- transforms -------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(28, 28), (8, 8), (7, 7), (6, 10)])
def test_rotation_matches_torchvision(tv_rotate: Rotate, shape: tuple[int, int]) -> None:
    x = torch.rand(16, 2, *shape, generator=torch.Generator().manual_seed(0)) + 0.1
    angles = [0.0, 0.7, 30.0, 45.0, 60.0, 90.0, 112.3, 135.0, 179.99, 180.0, 270.0, -33.0, 400.0]
    for degrees in angles:
        assert torch.equal(rotate_batch(x, degrees, chunk=5), tv_rotate(x, degrees)), degrees
        assert torch.equal(rotate_batch(x.double(), degrees), tv_rotate(x.double(), degrees))


def test_rotation_matches_torchvision_on_mnist(
    tv_rotate: Rotate, mnist_root: Path, mnist_floats: tuple[torch.Tensor, torch.Tensor]
) -> None:
    stream = mnist_stream(mnist_root, train_size=MNIST_TRAIN)
    assert isinstance(stream, RotatedStream)
    base = mnist_floats[0]
    for t, angle in enumerate(stream.angles):
        assert torch.equal(stream.task(t).train_x, tv_rotate(base, angle))


def test_rotation_uint8_equals_float_and_torchvision(tv_rotate: Rotate) -> None:
    x = torch.randint(0, 256, (10, 1, 28, 28), dtype=torch.uint8)
    for degrees in (17.0, 45.0, 151.5):
        rotated = rotate_batch(x, degrees)
        assert rotated.dtype == torch.uint8
        assert torch.equal(rotated, tv_rotate(x, degrees))
        assert torch.equal(rotated.float() / 255, rotate_batch(x.float() / 255, degrees))


def test_rotate_by_zero_and_full_turn_is_identity() -> None:
    x = torch.rand(5, 1, 8, 8)
    assert torch.equal(rotate_batch(x, 0.0), x)
    assert torch.equal(rotate_batch(x, 360.0), x)


def test_rotation_is_counter_clockwise_about_the_centre() -> None:
    # Just off 90 degrees takes the general sampling path; it must agree with rot90 (CCW).
    x = torch.rand(4, 3, 9, 9)
    assert torch.equal(rotate_batch(x, 90.0 + 1e-6), torch.rot90(x, 1, dims=(-2, -1)))
    assert torch.equal(rotate_batch(x, -90.0 + 1e-6), torch.rot90(x, 3, dims=(-2, -1)))


def test_rotation_does_not_depend_on_chunk() -> None:
    x = torch.rand(23, 1, 28, 28)
    assert torch.equal(rotate_batch(x, 37.0, chunk=4), rotate_batch(x, 37.0))


def test_rotation_rejects_half_precision() -> None:
    with pytest.raises(ValueError, match="float32, float64 or uint8"):
        rotate_batch(torch.rand(1, 1, 8, 8).half(), 10.0)


def test_permutation_is_a_bijection_of_pixel_values() -> None:
    x = torch.rand(6, 2, 5, 5)
    perm = torch.randperm(25, generator=torch.Generator().manual_seed(1))
    out = permute_pixels(x, perm)
    assert not torch.equal(out, x)
    assert torch.equal(out.flatten(2).sort(dim=2).values, x.flatten(2).sort(dim=2).values)
    assert torch.equal(out.flatten(2)[:, :, 3], x.flatten(2)[:, :, perm[3]])


def test_permutation_rejects_non_permutations() -> None:
    with pytest.raises(ValueError, match="permutation"):
        permute_pixels(torch.rand(1, 1, 2, 2), torch.tensor([0, 0, 1, 2]))


# --- rotated / permuted MNIST -----------------------------------------------------------


def test_rot_mnist_tasks_are_transformed_and_differ(
    mnist_root: Path, mnist_floats: tuple[torch.Tensor, torch.Tensor]
) -> None:
    stream = mnist_stream(mnist_root)
    assert isinstance(stream, RotatedStream)
    assert stream.scenario == "domain-il" and stream.input_shape == (1, 28, 28)
    assert all(0.0 <= a < 180.0 for a in stream.angles) and len(set(stream.angles)) == 3
    base = mnist_floats[0][:500]
    tasks = [stream.task(t) for t in range(3)]
    assert not torch.equal(tasks[0].train_x, base), "the first task must be rotated too"
    assert not torch.equal(tasks[0].train_x, tasks[1].train_x)
    for t, task in enumerate(tasks):
        assert task.index == t and task.classes == tuple(range(10))
        assert task.train_x.shape == (500, 1, 28, 28) and task.train_x.dtype == torch.float32
        assert task.test_x.shape == (200, 1, 28, 28)
        assert float(task.train_x.min()) >= 0.0 and float(task.train_x.max()) <= 1.0
        assert torch.equal(task.train_y, stream.train_labels(t))


def test_same_seed_same_tasks_different_seed_different_angles(mnist_root: Path) -> None:
    first, again = mnist_stream(mnist_root, seed=5), mnist_stream(mnist_root, seed=5)
    other = mnist_stream(mnist_root, seed=6)
    assert torch.equal(first.task(1).train_x, again.task(1).train_x)
    assert first.describe() == again.describe()
    assert first.angles != other.angles


def test_perm_mnist_first_task_permuted(
    mnist_root: Path, mnist_floats: tuple[torch.Tensor, torch.Tensor]
) -> None:
    stream = mnist_stream(mnist_root, name="perm-mnist")
    assert isinstance(stream, PermutedStream)
    task = stream.task(0)
    base = mnist_floats[1]
    assert not torch.equal(task.test_x, base)
    assert torch.equal(task.test_x, permute_pixels(base, stream.permutation(0)))


def test_describe_is_json_and_complete(mnist_root: Path) -> None:
    for name in ("rot-mnist", "perm-mnist"):
        description = mnist_stream(mnist_root, name=name).describe()
        text = json.dumps(description, sort_keys=True)
        assert json.loads(text) == description
        assert description["train_size"] == 500 and description["test_size"] == 200
        params = description.get("angles_deg") or description.get("permutation_hashes")
        assert isinstance(params, list) and len(params) == 3


def test_train_size_takes_a_prefix(mnist_root: Path) -> None:
    small = mnist_stream(mnist_root, train_size=100, test_size=50)
    large = mnist_stream(mnist_root, train_size=300, test_size=50)
    assert torch.equal(small.train_labels(0), large.train_labels(0)[:100])
    assert torch.equal(small.task(2).train_x, large.task(2).train_x[:100])


def test_bad_sizes_and_task_indices(mnist_root: Path) -> None:
    with pytest.raises(UserError, match=rf"--train-size 601 does not fit.*{MNIST_TRAIN}"):
        mnist_stream(mnist_root, train_size=MNIST_TRAIN + 1)
    with pytest.raises(UserError, match="--test-size 0 does not fit"):
        mnist_stream(mnist_root, test_size=0)
    stream = digits_stream()
    with pytest.raises(UserError, match=r"task 3 is out of range.*0\.\.2"):
        stream.task(3)
    with pytest.raises(UserError, match="task index must be an integer"):
        stream.train_labels("1")  # type: ignore[arg-type]


# --- digits and registry ----------------------------------------------------------------


def test_digits_split_and_range() -> None:
    train_x, train_y, test_x, test_y = load_digits()
    assert train_x.shape == (1437, 1, 8, 8) and test_x.shape == (360, 1, 8, 8)
    assert train_x.dtype == torch.float32 and train_y.dtype == torch.int64
    assert float(train_x.min()) == 0.0 and float(train_x.max()) == 1.0
    assert sorted(set(test_y.tolist())) == list(range(10))
    assert torch.equal(load_digits()[1], train_y), "the split must not depend on anything"
    assert torch.equal(digits_images().test_x.float() / 16, test_x)


def test_digits_streams_prefix_and_permutations() -> None:
    short, long = digits_stream(num_tasks=2), digits_stream(num_tasks=5)
    assert short.angles == long.angles[:2]
    perm = digits_stream("perm-digits")
    hashes = perm.describe()["permutation_hashes"]
    assert len(set(hashes)) == 3
    assert not torch.equal(perm.task(0).train_x, perm.task(1).train_x)


def test_registry_entries_and_errors() -> None:
    assert {"rot-mnist", "perm-mnist", "rot-digits", "perm-digits"} <= set(STREAMS)
    assert STREAMS["rot-mnist"].default_model == "mnist-cnn"
    assert not STREAMS["perm-digits"].needs_data_root
    with pytest.raises(UserError, match=r"unknown stream 'rot-cifar'.*perm-digits.*rot-mnist"):
        build_stream("rot-cifar", num_tasks=2, seed=0, device=CPU, data_root=None, download=False)
    with pytest.raises(UserError, match=r"--data-root.*MNIST/raw.*--download"):
        build_stream("rot-mnist", num_tasks=2, seed=0, device=CPU, data_root=None, download=False)
    with pytest.raises(UserError, match="number of tasks must be a positive integer"):
        digits_stream(num_tasks=0)


def test_fot_permuted_stream_keeps_task_one_in_place_and_normalises_like_fots_code() -> None:
    """FOT's data loader: ``np.arange`` for t = 0, a permutation after, and torchvision's
    Normalize((0.1307,), (0.3081,)) after ToTensor. On the embedded digits (16 levels): a
    black pixel is (0 - 0.1307) / 0.3081 = -0.424213 and a full one (1 - 0.1307) / 0.3081 =
    2.821487; later tasks are perm-digits' own permutations."""
    from cfl_bench.streams.digits import digits_images
    from cfl_bench.streams.domain_il import FOTPermutedStream

    images = digits_images()
    cpu = torch.device("cpu")
    fot = FOTPermutedStream(images, name="perm-digits", num_tasks=3, seed=4, device=cpu)
    plain = PermutedStream(images, name="perm-digits", num_tasks=3, seed=4, device=cpu)
    assert torch.equal(fot.task_test(0).test_x, images.test_x)
    assert torch.equal(fot.permutation(0), torch.arange(64))
    for t in (1, 2):
        assert torch.equal(fot.task_test(t).test_x, plain.task_test(t).test_x)
    pixels = torch.tensor([[0, 16, 8]], dtype=torch.uint8)
    expected = torch.tensor([[-0.424213, 2.821487, 1.198637]])
    assert torch.allclose(fot.as_model_input(pixels), expected, atol=1e-6)
    assert fot.describe()["normalisation"] == "mean 0.1307, std 0.3081"
