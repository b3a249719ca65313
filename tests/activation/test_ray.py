"""A real local Ray cluster: an actor, and a process the actor spawns, report the library active.

Once through the environment the cluster inherits from the driver, once through the ``ray-env``
runtime_env on a cluster started from a driver whose environment has neither the shim nor DUMP_ON.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from support.interpreter import clean_env, run_python, shim_env

pytestmark = pytest.mark.interpreter  # starts fresh interpreters (make test-fast leaves it out)

DRIVER = """
import json, os, sys
import ray

def probe():
    import msprobe_hooks
    return {"pid": os.getpid(), "active": msprobe_hooks.current_config() is not None}

@ray.remote(num_cpus=1)
class Worker:
    def report(self):
        from msprobe_hooks.cli.doctor import SPAWN_CHECKS  # a multiprocessing spawn child, as vLLM/SGLang make

        return {"actor": probe(), "spawned": SPAWN_CHECKS["spawn"]()}

runtime_env = json.loads(sys.argv[1]) if len(sys.argv) > 1 else None
ray.init(num_cpus=1, include_dashboard=False, runtime_env=runtime_env)
try:
    report = ray.get(Worker.remote().report.remote(), timeout=300)
finally:
    ray.shutdown()
report["driver"] = "msprobe_hooks" in sys.modules and sys.modules["msprobe_hooks"].current_config() is not None
print(json.dumps(report))
"""


def run_driver(env: dict[str, str], tmp_path, *args: str) -> dict:
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    done = subprocess.run([sys.executable, str(script), *args], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def assert_active_in_actor_and_its_child(report: dict) -> None:
    assert report["actor"]["active"] is True
    assert report["spawned"]["active"] is True
    assert report["spawned"]["pid"] != report["actor"]["pid"]


def test_inherited_environment_reaches_an_actor_and_its_spawned_child(tmp_path, ray_tmp):
    report = run_driver(shim_env(DUMP_ON="1", RAY_TMPDIR=ray_tmp), tmp_path)
    assert report["driver"] is True
    assert_active_in_actor_and_its_child(report)


def test_ray_env_runtime_env_reaches_a_cluster_that_did_not_inherit(tmp_path, ray_tmp):
    printed = run_python(
        "from msprobe_hooks.cli import main; main(['ray-env', '--format', 'json'])", clean_env(), cwd=tmp_path
    )
    assert printed.returncode == 0, printed.stderr
    runtime_env = printed.stdout
    # The driver, and so the cluster it starts, has neither the shim nor DUMP_ON.
    report = run_driver(clean_env(RAY_TMPDIR=ray_tmp), tmp_path, runtime_env)
    assert report["driver"] is False
    assert_active_in_actor_and_its_child(report)


def test_without_either_the_cluster_stays_inactive(tmp_path, ray_tmp):
    report = run_driver(clean_env(RAY_TMPDIR=ray_tmp), tmp_path)
    assert report["actor"]["active"] is False and report["spawned"]["active"] is False
