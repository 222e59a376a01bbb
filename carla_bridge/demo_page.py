"""The CARLA demo's page: mAP@0.5 per domain over rounds, and predicted vs true boxes.

Why a page of its own beside ``cfl-bench report``: the demo's question is visual — does the
urban mAP drop when a vehicle drives onto the highway, and what does the detector see — so
the page plots the per-round evaluations of each domain (urban, highway, the Town05 test
town) with the shift marked, and draws the final global model's boxes on held-out frames.
Everything is read back from the run directory (records.csv, config.json, model.pt), so the
page can be rebuilt for any finished demo run.
"""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path

import pandas as pd
import torch

from cfl_bench.core.atomic import atomic_write_text

#: What each evaluated set is called on the page (the carla-highway stream's tasks).
DOMAIN_NAMES = {0: "urban (Town01–03)", 1: "highway (Town04)", -1: "Town05 (test town)"}
#: Predicted boxes drawn on the example frames: the detector's most confident ones.
SHOW_SCORE = 0.3
#: The mAP axis spans at least this many points (% mAP), so early all-zero curves sit on
#: the floor of a readable axis.
MIN_Y_SPAN = 5.0


def map_over_rounds(records: pd.DataFrame) -> dict[str, pd.Series]:
    """mAP@0.5 (%) per evaluated domain, indexed by round (the latest row of each round)."""
    curves: dict[str, pd.Series] = {}
    rows = records[records["scope"] == "global"]
    for eval_task, name in DOMAIN_NAMES.items():
        metric = "test_map50" if eval_task < 0 else "map50"
        chosen = rows[(rows["metric"] == metric) & (rows["eval_task"].astype(int) == eval_task)]
        if chosen.empty:
            continue
        series = chosen.astype({"round": int}).groupby("round")["value"].last().astype(float)
        curves[name] = series
    return curves


def curves_svg(curves: dict[str, pd.Series], shift_round: int | None) -> str:
    """The curves as an inline SVG (matplotlib, no files)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    for name, series in curves.items():
        ax.plot(series.index, series.to_numpy(), marker="o", markersize=3, label=name)
    # Rounds are whole numbers; and an all-zero start (no box found yet) must not be drawn
    # as a line in the middle of a ±0.05 axis: the y axis spans at least MIN_Y_SPAN points.
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0.0, axis_top(curves))
    if shift_round is not None:
        ax.axvline(shift_round + 0.5, color="grey", linestyle="--", linewidth=1)
        ax.text(shift_round + 0.6, ax.get_ylim()[1] * 0.95, "highway shift", color="grey")
    ax.set_xlabel("round")
    ax.set_ylabel("mAP@0.5 (%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg")
    plt.close(fig)
    text = buffer.getvalue()
    return text[text.index("<svg") :]


def axis_top(curves: dict[str, pd.Series]) -> float:
    """The mAP axis' top: 10 % above the highest point, and at least ``MIN_Y_SPAN``."""
    highest = max((float(s.max()) for s in curves.values() if len(s)), default=0.0)
    return max(MIN_Y_SPAN, highest * 1.1)


def frame_png(
    image: torch.Tensor,
    truth: torch.Tensor,
    predicted: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
) -> str:
    """A frame (3×H×W uint8) with true boxes (green) and predicted ones (red), as a
    base64 PNG."""
    from PIL import Image, ImageDraw

    from cfl_bench.carla_bridge.detection import unpack_targets
    from cfl_bench.carla_bridge.frames import CLASSES

    picture = Image.fromarray(image.permute(1, 2, 0).cpu().numpy())
    draw = ImageDraw.Draw(picture)
    boxes, _ = unpack_targets(truth.unsqueeze(0))[0]
    for box in boxes.tolist():
        draw.rectangle(box, outline=(40, 220, 40), width=1)
    boxes_p, scores, labels_p = predicted
    for (x1, y1, x2, y2), score, label in zip(
        boxes_p.tolist(), scores.tolist(), labels_p.tolist(), strict=True
    ):
        draw.rectangle((x1, y1, x2, y2), outline=(230, 40, 40), width=1)
        draw.text((x1, max(0.0, y1 - 10)), f"{CLASSES[int(label)]} {score:.2f}", fill=(230, 40, 40))
    out = io.BytesIO()
    picture.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode("ascii")


def example_frames(run_dir: Path, config: dict[str, object]) -> list[tuple[str, str, int]]:
    """(caption, base64 PNG, predicted boxes drawn) of one held-out frame per domain, with
    θ_g's boxes."""
    from cfl_bench.carla_bridge.detection import Detection, decode_boxes
    from cfl_bench.carla_bridge.detector import build_detector
    from cfl_bench.carla_bridge.stream import frame_stream
    from cfl_bench.streams.base import StreamRequest

    run = config["config"]
    assert isinstance(run, dict)
    model_path = run_dir / "model.pt"
    if not model_path.exists() or str(run.get("stream")) == "carla-live":
        return []
    request = StreamRequest(
        num_tasks=int(run["tasks"]),
        seed=int(run["seed"]),
        device=torch.device("cpu"),
        data_root=str(run["data_root"]),
        download=False,
        num_clients=int(run["clients"]),
    )
    stream = frame_stream(str(run["stream"]), request)
    model = build_detector(tuple(stream.input_shape), stream.num_classes)
    model.load_state_dict(torch.load(model_path, map_location="cpu", weights_only=True))
    tests = [stream.task_test(t) for t in range(stream.num_tasks)]
    test_town = stream.test_domain()
    sets = [*tests, *([test_town] if test_town is not None else [])]
    names = [DOMAIN_NAMES.get(t, f"task {t + 1}") for t in range(len(tests))] + [DOMAIN_NAMES[-1]]
    shown = []
    for name, split in zip(names, sets, strict=True):
        boxes_per_frame = split.test_y[:, :, 0].ge(0).sum(dim=1)
        row = int(boxes_per_frame.argmax())  # the busiest frame shows the most
        outputs = Detection().predict(model, split.test_x[row : row + 1], stream.as_model_input)
        predicted = decode_boxes(outputs, top_k=50, score_threshold=SHOW_SCORE)[0]
        png = frame_png(split.test_x[row], split.test_y[row], predicted)
        shown.append((name, png, int(predicted[1].numel())))
    return shown


def no_box_note(predicted: int) -> str:
    """Why a frame shows no red box: none of the detector's boxes reaches SHOW_SCORE yet,
    as after a short demo (the scores start near 0 and grow over tens of rounds)."""
    if predicted:
        return ""
    return (
        f" — no predicted box reaches score {SHOW_SCORE} yet (a detector trained for only a "
        "few rounds is still unsure of everything; run more --rounds)"
    )


def final_table(curves: dict[str, pd.Series], shift_round: int | None) -> str:
    """mAP@0.5 per domain at the shift (the last urban round) and after the last round:
    the drop between the two is what the shift costs."""

    def at(series: pd.Series, round_: int | None) -> str:
        if round_ is None or round_ not in series.index:
            return "–"
        return f"{series.loc[round_]:.2f}"

    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{at(series, shift_round)}</td>"
        f"<td>{series.iloc[-1]:.2f}</td></tr>"
        for name, series in curves.items()
    )
    return (
        "<table><tr><th>domain</th><th>mAP@0.5 % at the shift</th><th>after the last round"
        f"</th></tr>{rows}</table>"
    )


def write_demo_page(run_dir: Path) -> Path:
    """Write ``carla_demo.html`` into ``run_dir`` (atomically) and return its path."""
    records = pd.read_csv(run_dir / "records.csv")
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    run = config["config"]
    lead, per_task = int(run.get("lead_rounds") or 0), int(run["rounds_per_task"])
    shift = lead + per_task if int(run["tasks"]) > 1 else None
    curves = map_over_rounds(records)
    figures = "".join(
        f'<figure><img alt="{html.escape(c)}" src="data:image/png;base64,{png}">'
        f"<figcaption>{html.escape(c)}: true boxes green, predicted (score ≥ {SHOW_SCORE}) "
        f"red{no_box_note(count)}</figcaption></figure>"
        for c, png, count in example_frames(run_dir, config)
    )
    title = f"CARLA demo · {run['strategy']} · {run['stream']}"
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;color:#222}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:.3rem .6rem}}
figure{{display:inline-block;margin:.5rem}}img{{max-width:100%}}</style></head><body>
<h1>{html.escape(title)}</h1>
<p>{int(run["clients"])} vehicle clients; {lead + per_task} urban rounds, then vehicle 0
drives onto the highway for {per_task} rounds. Every round the global model is evaluated
on held-out frames of each domain and on Town05, which no client trains on.</p>
<h2>mAP@0.5 over rounds</h2>{curves_svg(curves, shift)}
<h2>At the shift and at the end</h2>{final_table(curves, shift)}
<h2>Example frames</h2>{figures or "<p>No model was saved or the frames were live.</p>"}
</body></html>
"""
    path = run_dir / "carla_demo.html"
    atomic_write_text(path, page)
    return path
