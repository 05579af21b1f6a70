"""scripts/step_profile.py: the profiler window covers exactly the asked optimizer steps, of either loop."""

from __future__ import annotations

import importlib.util

import pytest

from tests.conftest import REPO_ROOT, classification_config

spec = importlib.util.spec_from_file_location("step_profile", REPO_ROOT / "scripts" / "step_profile.py")
step_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(step_profile)


@pytest.mark.parametrize("setting", ["bertpipe", "trainer_default"])
def test_profile_records_the_window_of_optimizer_steps(tmp_path, tiny_bert, sentiment_files, setting):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, mixed_precision="no")
    averages = step_profile.profile_steps(str(config), ["train.max_steps=6"], setting=setting, skip=2, steps=3)

    by_name = {event.key: event for event in averages}
    assert by_name["ProfilerStep*"].count == 3  # steps 3-5 of 6, no more
    assert "aten::addmm" in by_name and "aten::_fused_adamw_" in by_name  # the Linear layers and the optimizer ran inside
    table = step_profile.table(averages, steps=3, top=5)
    assert table.splitlines()[0] == "| op | ms / step | calls / step | share |" and len(table.splitlines()) == 2 + 5 + 1
    assert not (tmp_path / "run").exists()  # the run went to a temporary folder, not the config's output_dir


def test_a_window_past_the_runs_end_is_refused(tmp_path, tiny_bert, sentiment_files):
    config = classification_config(tmp_path, tiny_bert, sentiment_files, mixed_precision="no")
    with pytest.raises(SystemExit, match=r"the run ended after 6 optimizer steps: ask for fewer than --skip 4 \+ --steps 3"):
        step_profile.profile_steps(str(config), ["train.max_steps=6"], setting="bertpipe", skip=4, steps=3)
