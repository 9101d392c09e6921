"""studies/lib/plan.py: a missing key names the plan file and the section.

  PYTHONPATH=. /usr/bin/python3 -m pytest tests/studies/test_plan.py
"""
import os

import pytest

from studies.lib import plan


def test_missing_key_names_file_and_section(tmp_path):
    (tmp_path / "plan.toml").write_text('seeds = [1, 2]\n[rules]\nse_multiple = 2\n[rules.inner]\nx = 1\n')
    p = plan.load(str(tmp_path / "run.py"))
    assert p["rules"]["se_multiple"] == 2 and p.get("nothing") is None and isinstance(p["rules"], dict)
    with pytest.raises(KeyError, match=r"plan\.toml: \[rules\] has no key 'se_multipel'"):
        p["rules"]["se_multipel"]
    with pytest.raises(KeyError, match=r"\[rules\.inner\] has no key 'y'"):
        p["rules"]["inner"]["y"]
    with pytest.raises(KeyError, match="the top level has no key 'rule'"):
        p["rule"]
    with pytest.raises(KeyError, match=os.path.basename(str(tmp_path))):
        p["rule"]
