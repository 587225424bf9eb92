"""The benchmarks' fixed-width tables: a header takes its cells' width and alignment."""

from prism.bench import text_table

COLUMNS = [("name", "<6", lambda r: r["name"]), ("n", ">5,", lambda r: r["n"]), text_table.SEP,
           ("ratio", "6.2f", lambda r: r["a"] / r["b"])]


def test_header_and_cells_line_up():
    rows = [{"name": "tp2", "n": 1234, "a": 1, "b": 3}, {"name": "pp2-dp4", "n": 7, "a": 3, "b": 2}]
    assert text_table.render("title", COLUMNS, rows).splitlines() == [
        "title",
        "name       n |  ratio",
        "tp2    1,234 |   0.33",
        "pp2-dp4     7 |   1.50",  # a cell wider than its column widens that line only, as format() does
    ]


def test_header_is_right_aligned_unless_the_spec_says_otherwise():
    assert text_table.header([("x", "8.1f", None), ("y", "<4", None), ("z", "^5", None), ("w", "", None)]) \
        == "       x y      z   w"
