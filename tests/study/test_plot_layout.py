"""Sweep plots read at any size: the title fits the figure, tick labels do not run into each other, the legend
covers no line, a line hidden under another shows, and a plot without a title gets one (issue 38)."""

from types import SimpleNamespace

import pytest

import matplotlib  # noqa: E402  (a dependency of hcsim: never skipped)

matplotlib.use("Agg")

from hcsim.study.plotting import default_title, plot_experiment, plot_rows  # noqa: E402


@pytest.fixture
def figures(monkeypatch):
    """The figures plot_rows draws, kept open after it saves them."""
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda figure=None: kept.append(figure))
    yield kept
    for figure in kept:
        figure.clf()


def _row(**values):
    return {"status": "ok", **values}


def test_a_long_title_is_wrapped_inside_the_figure(tmp_path, figures):
    rows = [_row(plan=p, coherent=c, samples_per_s=1.0 + i) for i, p in enumerate(["a", "b"]) for c in (True, False)]
    title = "LLaMA2-13B on 128 H100 + 128 A100: how to train a mixed cluster, and a good deal more words besides"
    plot_rows(rows, {"x": "plan", "y": "samples_per_s", "series": "coherent", "kind": "bar", "title": title},
              tmp_path / "p")
    figure = figures[0]
    box = figure._suptitle.get_window_extent(figure.canvas.get_renderer())
    assert box.x0 >= 0 and box.x1 <= figure.bbox.width, (box, figure.bbox.width)
    assert "\n" in figure._suptitle.get_text()


def test_crowded_bar_labels_do_not_run_into_each_other(tmp_path, figures):
    systems = ["H100", "A100", "V100", "H100+A100 even", "H100+A100 proportional", "H100+V100 even",
               "H100+V100 proportional", "H100+A100+V100 proportional"]
    rows = [_row(system=s, xpus=n, coherent=c, samples_per_s=10.0 + i)
            for i, s in enumerate(systems) for n in (256, 1024) for c in (True, False)]
    plot_rows(rows, {"x": "system", "y": "samples_per_s", "series": "xpus", "panels": "coherent", "kind": "bar",
                     "title": "t"}, tmp_path / "p")
    figure = figures[0]
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        assert len(boxes) == len(systems)
        assert all(a.x1 <= b.x0 for a, b in zip(boxes, boxes[1:])), [(b.x0, b.x1) for b in boxes]


def test_standing_bar_labels_stay_inside_the_axes_below_the_panel_title(tmp_path, figures):
    """gh200-offload's picture: twelve bars a panel, their labels stood up, the tallest's ran into the panel's
    title; large values read in k (322k, not 3.22e+05)."""
    configs = ["ZeRO-3", "ZeRO-1", "Grace in place", "ZeRO-1 + Grace in place", "Grace CPU step", "ZeRO-1 + step"]
    rows = [_row(config=c, scale=s, compute_model=m, tokens_per_s=(46_500.0 + 9_000 * i) * (4 if s == "32" else 1))
            for i, c in enumerate(configs) for s in ("8", "32") for m in ("peak", "roofline")]
    plot_rows(rows, {"x": "config", "y": "tokens_per_s", "series": "scale", "panels": "compute_model", "kind": "bar",
                     "title": "t"}, tmp_path / "p")
    figure = figures[0]
    renderer = figure.canvas.get_renderer()
    for ax in figure.axes:
        labels = [t for t in ax.texts if t.get_text()]
        assert labels and all(t.get_rotation() == 90 for t in labels)
        top = min(ax.get_window_extent(renderer).y1, ax.title.get_window_extent(renderer).y0)
        assert all(t.get_window_extent(renderer).y1 <= top for t in labels)
        assert {"46.5k", "366k"} <= {t.get_text() for t in labels}
    assert figure.axes[0].get_ylabel() == "Throughput (tokens/s)"


def test_bar_values_read_in_three_digits_with_k_m_and_g():
    from hcsim.study.plotting import _bar_text

    assert [_bar_text(v) for v in (0.0303, 178, 999.7, 46_500, 1.68e6, 2.5e9, -4_500, 0)] == \
        ["0.0303", "178", "1k", "46.5k", "1.68M", "2.5G", "-4.5k", "0"]


def test_the_legend_covers_no_line(tmp_path, figures):
    # Fig. 8 per XPU: lines along the top, the middle and the bottom leave "best" no free corner
    rows = [_row(xpus=n, devices=d, coherent=c, batches_per_s_per_xpu=y)
            for d, c, ys in (("H100", True, [0.17, 0.17, 0.17, 0.17, 0.17]),
                             ("H100", False, [0.09, 0.085, 0.08, 0.078, 0.073]),
                             ("H100+A100", True, [0.17, 0.168, 0.06, 0.06, 0.06]),
                             ("H100+A100", False, [0.086, 0.085, 0.05, 0.05, 0.05]),
                             ("H100+V100", True, [0.17, 0.168, 0.048, 0.048, 0.048]),
                             ("H100+V100", False, [0.086, 0.085, 0.042, 0.042, 0.042]))
            for n, y in zip((64, 128, 256, 512, 1024), ys)]
    plot_rows(rows, {"x": "xpus", "y": "batches_per_s_per_xpu", "series": ["devices", "coherent"], "logx": True,
                     "title": "t"}, tmp_path / "p")
    figure = figures[0]
    (ax,) = figure.axes
    renderer = figure.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    for line in ax.get_lines():
        path = line.get_transform().transform_path(line.get_path())
        assert not path.intersects_bbox(legend, filled=False), line.get_label()
    assert legend.x1 <= figure.bbox.width + 1  # moved beside the axes, inside the figure


def test_a_line_hidden_under_a_later_one_is_drawn_wider(tmp_path, figures):
    rows = [_row(cxl_bandwidth_Bps=b, level=level, batches_per_s=y)
            for level, ys in (("layer", [4.3, 11.1]), ("representative", [4.3, 11.1]), ("decoder", [4.4, 13.4]))
            for b, y in zip((32e9, 128e9), ys)]
    plot_rows(rows, {"x": "cxl_bandwidth", "y": "batches_per_s", "series": "level", "title": "t"}, tmp_path / "p")
    widths = {line.get_label(): line.get_linewidth() for line in figures[0].axes[0].get_lines()}
    assert widths["level = layer"] > widths["level = representative"] == widths["level = decoder"]


def test_a_plot_without_a_title_is_titled_from_the_experiment(tmp_path, figures):
    experiment = SimpleNamespace(name="allreduce-training", plots=[{"x": "collective", "y": "iteration_time_s",
                                                                    "series": "xpus", "kind": "bar"}],
                                 points=lambda: [], axis_columns=lambda: [])
    rows = [_row(collective=c, xpus=n, iteration_time_s=1.0) for c in ("ring", "tree") for n in (64, 256)]
    plot_experiment(experiment, rows, tmp_path)
    assert figures[0]._suptitle.get_text() == "allreduce-training: iteration time (s) by collective and xpus"
    assert default_title("x", {"x": "xpus", "y": "idle_s"}) == "x: idle (waiting for peers) per iteration (s) by " \
                                                              "scale (number of XPUs)"


def test_the_kv_legend_lies_outside_the_axes_the_capacity_line_crosses(tmp_path, figures):
    from hcsim.run.pictures import plot_kv_occupancy

    occupancy = [(0, t, min(100.0 * t, 1000.0), max(0.0, 100.0 * t - 1000.0), t) for t in range(20)]
    result = {"occupancy": occupancy, "kv": {"spilled_to": "cxl_type3", "hbm_tokens_per_replica": 1000.0},
              "scenario": "s", "model": "m", "xpus": 8, "device": "H100"}
    plot_kv_occupancy(result, tmp_path / "kv.png")
    figure = figures[0]
    ax = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    legend = ax.get_legend().get_window_extent(renderer)
    assert legend.y1 <= ax.get_window_extent(renderer).y0, "the legend lies over the plot"
    assert legend.y0 >= 0 and legend.x0 >= 0 and legend.x1 <= figure.bbox.width


def test_a_serving_runs_latencies_are_drawn_as_distributions_with_p50_p99_and_the_slo(tmp_path, figures):
    """latency.png: per panel the fraction of requests within each time (reaching 1 at the slowest), its p50 and
    p99 by nearest rank as the summary's, and the SLO's target where one is set."""
    from hcsim.run.pictures import plot_latencies

    rows = [{"arrival_s": 0.1 * i, "ttft_s": 0.009 * (i + 1), "tpot_s": 0.02, "finish_s": 0.1 * i + 2.0 + i}
            for i in range(100)]
    result = {"per_request": rows, "slo": {"ttft_s": 0.5, "tpot_s": None}, "scenario": "s", "model": "m",
              "xpus": 8, "device": "H100"}
    plot_latencies(result, tmp_path / "latency.png")
    ttft, tpot, e2e = figures[0].axes
    curve = ttft.get_lines()[0]
    assert list(curve.get_ydata()) == [(i + 1) / 100 for i in range(100)]
    assert list(curve.get_xdata()) == pytest.approx([9.0 * (i + 1) for i in range(100)])  # ms
    labels = [line.get_label() for line in ttft.get_lines()[1:]]
    assert labels == ["p50 450 ms", "p99 891 ms", "SLO 500 ms"]
    assert [line.get_label() for line in tpot.get_lines()[1:]] == ["p50 20 ms", "p99 20 ms"]  # no tpot target
    assert e2e.get_xlabel() == "end to end (s)" and e2e.get_lines()[2].get_label() == "p99 100 s"
