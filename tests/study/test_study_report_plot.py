"""The figure of ``depthattn study report`` (``study.report_plot``)."""

from depthattn.study import report_plot


def test_the_delta_figure_draws_each_methods_cells_and_nothing_without_rows(tmp_path):
    d = {"mean": -0.05, "ci95": (-0.09, -0.01), "diffs": [-0.04, -0.06]}
    one = {"mean": 0.02, "ci95": None, "diffs": [0.02]}
    png = tmp_path / "fig" / "r_delta.png"
    assert report_plot.delta_figure({"depth_attention": [("s-b1", d), ("s-b4", one)], "attnres": []}, "none", png,
                                    "t")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and not list(png.parent.glob("*.tmp*"))
    assert not report_plot.delta_figure({"attnres": []}, "none", tmp_path / "none.png", "t")
    assert not (tmp_path / "none.png").exists()


def test_cell_names_lose_the_prefix_they_all_share():
    assert report_plot._short(["toy-b1-lr0.001", "toy-b4-lr0.001"]) == ["b1-lr0.001", "b4-lr0.001"]
    assert report_plot._short(["toy-b1", "toy-b2"]) == ["b1", "b2"]
    assert report_plot._short(["main"]) == ["main"]
