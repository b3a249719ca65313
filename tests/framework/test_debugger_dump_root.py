"""debugger.set_dump_root: a debugger made by someone else dumps where we say, also after a config reload."""

from __future__ import annotations

import json

import pytest
from support.interpreter import clean_env, run_python

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

CHILD = """
import json, os, torch
from msprobe.pytorch import PrecisionDebugger
from msprobe_hooks import debugger

config_path, root = CONFIG, ROOT
native = PrecisionDebugger(config_path)        # as an engine's own switch makes it: config path only
model = torch.nn.Sequential(torch.nn.Linear(4, 4))

def one_step():
    native.start(model)
    model(torch.ones(2, 4))
    native.stop()
    native.step()

debugger.set_dump_root(native, os.path.join(root, "mine"))
one_step()                                       # step0
config = json.load(open(config_path))
config["level"] = "L0"                           # another size: the file's signature changes
config["extra_info"] = False
json.dump(config, open(config_path, "w"))
reloaded = native._maybe_reload_config(force=True)
one_step()                                       # step1, after the reload
print(json.dumps({"reloaded": reloaded, "is_ours": debugger.existing() is native}))
"""


def test_dumps_follow_the_redirect_across_a_config_reload(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"task": "statistics", "level": "mix", "dump_enable": True, "dump_path": str(tmp_path / "native")})
    )
    code = f"CONFIG, ROOT = {str(config)!r}, {str(tmp_path)!r}\n" + CHILD
    result = run_python(code, clean_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.json() == {"reloaded": True, "is_ours": True}
    assert sorted(p.parent.parent.name for p in (tmp_path / "mine").glob("step*/*/dump.json")) == ["step0", "step1"]
    assert not (tmp_path / "native").exists()
