"""The README's configuration table is the config schema's: generated from the fields' docstrings,
and this test fails when the README holds another table (run ``python scripts/config_table.py``)."""

from __future__ import annotations

from pathlib import Path

from pipelines.config_docs import BEGIN, END, readme_table, reference_table, rows, update_readme
from scripts.config_table import main as config_table_main

README = Path(__file__).resolve().parents[2] / "README.md"


def test_config_docs_readme_table_is_the_schema():
    assert readme_table(README.read_text(encoding="utf-8")) == reference_table(), "run python scripts/config_table.py"


def test_config_docs_every_field_has_a_row_with_a_meaning():
    table = {key: (default, meaning) for key, default, meaning in rows()}
    # The keys the hand-kept table had missed.
    for key in ("data.preprocessing_num_workers", "train.adam_beta1", "train.adam_beta2", "train.adam_epsilon"):
        assert key in table
    assert table["train.adam_epsilon"][0] == "1e-8" and table["train.learning_rate"][0] == "5e-5"
    assert table["task"][0] == "required" and table["train.report_to"][0] == "`[]`" and table["model.dropout"][0] == "—"
    assert "model.peft.r" in table and "distill.teacher" in table and not any(key.startswith("task_options") for key in table)
    undocumented = [key for key, (_, meaning) in table.items() if not meaning]
    assert not undocumented, f"give these config fields a docstring: {undocumented}"


def test_config_docs_update_rewrites_only_the_generated_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n\n{BEGIN}\n| stale | table |\n{END}\n\nafter\n", encoding="utf-8")
    assert config_table_main(["--check", str(readme)]) == 1
    assert update_readme(readme)
    text = readme.read_text(encoding="utf-8")
    assert readme_table(text) == reference_table()
    assert text.startswith(f"# title\n\n{BEGIN}\n| key |") and text.endswith(f"{END}\n\nafter\n")
    assert not update_readme(readme) and config_table_main(["--check", str(readme)]) == 0
