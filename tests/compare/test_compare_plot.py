"""loss_curves.png (``compare.plot_curves``): titles that do not overlap, one colour per method in every panel, and
a Δ panel that says which side of 0 is better."""

from __future__ import annotations

import itertools

from matplotlib.colors import to_hex

from depthattn.compare import BASELINE, method_colours, plot_curves

from helpers import hand_made_results as results


def _lines(ax) -> dict[str, str]:
    """{label: colour} of the labelled lines of ``ax``."""
    return {line.get_label(): to_hex(line.get_color()) for line in ax.get_lines()
            if not line.get_label().startswith("_")}


def test_each_method_has_one_colour_in_every_panel(tmp_path):
    res = results()
    fig = plot_curves(res, tmp_path / "curves.png")
    colours = {k: to_hex(v) for k, v in method_colours(res).items()}
    val, delta, train = fig.axes[:3]
    assert _lines(val) == colours and _lines(train) == colours
    assert _lines(delta) == {k: v for k, v in colours.items() if k != BASELINE}  # none is not drawn against itself
    assert colours[BASELINE] not in _lines(delta).values()  # its colour means none, nowhere else


def test_the_delta_panel_says_below_0_is_better_and_titles_do_not_overlap(tmp_path):
    fig = plot_curves(results(), tmp_path / "curves.png")
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert f"below 0: better than {BASELINE}" in fig.axes[1].get_title()
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    renderer = FigureCanvasAgg(fig).get_renderer()  # the closed figure's own canvas no longer draws
    fig.draw(renderer)  # lay out (constrained layout) as savefig did
    boxes = [a.title.get_window_extent(renderer) for a in fig.axes]
    assert all(b.width > 0 for b in boxes)
    for a, b in itertools.combinations(boxes, 2):
        assert not a.overlaps(b), (a, b)
