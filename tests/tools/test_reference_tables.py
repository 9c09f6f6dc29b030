"""The tables docs/ derives from the code (recipes, module hyperparameters) are current: a recipe or a
hyperparameter that changes without `make docs` fails here."""

from tools import reference_tables


def test_generated_doc_tables_match_the_code(capsys):
    assert reference_tables.main(["--check"]) == 0, capsys.readouterr().out


def test_a_cell_with_a_vertical_bar_stays_one_cell():
    assert reference_tables.cell("-r1 log(1 + r2 |i - j|)") == "-r1 log(1 + r2 \\|i - j\\|)"
