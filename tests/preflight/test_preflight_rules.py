"""Every preflight rule, violated and satisfied, on verl 0.9.1's real Hydra config.

Each case starts from verl's ``ppo_trainer`` composed with the ``recipe`` overrides (which must
give no finding), adds one violation, and expects exactly the named rules to fire; then the
finding's own fix is applied and the config must come out clean.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from omegaconf import OmegaConf

from msprobe_hooks import config as config_module
from msprobe_hooks import preflight
from msprobe_hooks.cli.launch import shim_dir
from msprobe_hooks.preflight import findings, recipe, rules, verl_config
from msprobe_hooks.training import virtual_pipeline

GPUS = 4


@pytest.fixture(scope="module")
def generate_config(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("gen") / "generate_config.json"
    path.write_text(json.dumps({"task": "statistics", "level": "L0", "step": []}))
    return str(path)


@dataclass
class Case:
    id: str
    overrides: list[str]
    rules: set[str]
    backend: str = "fsdp"
    rollout: str = "vllm-ascend"
    env: dict[str, str] = field(default_factory=dict)
    drop_env: tuple[str, ...] = ()
    drop_overrides: tuple[str, ...] = ()
    fixable: bool = True


CASES = [
    Case("train-batch", ["data.train_batch_size=8"], {"batch-size"}),
    Case("mini-batch", ["actor_rollout_ref.actor.ppo_mini_batch_size=2"], {"batch-size"}),
    Case("micro-batch", ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"], {"batch-size"}),
    Case("deprecated-micro", ["actor_rollout_ref.actor.ppo_micro_batch_size=4"], {"batch-size"}),
    Case("n-below-dp", ["actor_rollout_ref.rollout.n=2"], {"rollout-n"}),
    Case(
        "n-with-two-nodes",
        ["trainer.nnodes=2", "actor_rollout_ref.rollout.tensor_model_parallel_size=8"],
        {"rollout-n"},
    ),
    Case("ulysses", ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2"], {"sequence-parallel"}),
    Case("ulysses-ref", ["actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"], {"sequence-parallel"}),
    Case("padding", ["actor_rollout_ref.model.use_remove_padding=False"], {"remove-padding"}),
    Case("dynamic-actor", ["actor_rollout_ref.actor.use_dynamic_bsz=True"], {"dynamic-batch"}),
    Case("dynamic-ref", ["actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True"], {"dynamic-batch"}),
    Case("dynamic-rollout", ["actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True"], {"dynamic-batch"}),
    Case("balance", ["trainer.balance_batch=True"], {"balance-batch"}),
    Case("validation", ["trainer.val_before_train=True"], {"val-before-train"}),
    Case("skip-v1", ["skip.rollout_tq.enable=True"], {"rollout-skip"}),
    Case("skip-v0", ["skip.rollout.enable=True"], {"rollout-skip"}),
    Case("graph-mode", ["actor_rollout_ref.rollout.enforce_eager=False"], {"eager-rollout"}),
    Case("dynamo", [], {"torchdynamo"}, drop_env=("TORCHDYNAMO_DISABLE",)),
    Case("dynamo-other-value", [], {"torchdynamo"}, env={"TORCHDYNAMO_DISABLE": "0"}),
    Case("ray-cluster-apart", ["+ray_kwargs.ray_init.address=127.0.0.1:6379"], {"ray-runtime-env"}, fixable=False),
    Case("ray-address-variable", [], {"ray-runtime-env"}, env={"RAY_ADDRESS": "auto"}, fixable=False),
    Case("prefix-cache", ["actor_rollout_ref.rollout.enable_prefix_caching=True"], {"prefix-caching"}),
    Case("chunked", ["actor_rollout_ref.rollout.enable_chunked_prefill=True"], {"chunked-prefill"}),
    Case("fsdp-tp", ["actor_rollout_ref.rollout.tensor_model_parallel_size=2"], {"fsdp-rollout-parallel"}),
    Case("fsdp-dp", ["actor_rollout_ref.rollout.data_parallel_size=2"], {"fsdp-rollout-parallel"}),
    Case(
        "strategy",
        ["actor_rollout_ref.actor.strategy=torchtitan"],
        {"training-strategy"},
        fixable=False,  # the fix names an engine group, not a key
    ),
    Case(
        "megatron-rollout-pp",
        ["actor_rollout_ref.rollout.pipeline_model_parallel_size=2"],
        {"megatron-rollout-parallel"},
        "megatron",
    ),
    Case(
        "megatron-rollout-ep",
        ["actor_rollout_ref.rollout.expert_parallel_size=2"],
        {"megatron-rollout-parallel"},
        "megatron",
    ),
    Case(
        "megatron-ref-tp",
        ["actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2"],
        {"megatron-rollout-parallel"},
        "megatron",
    ),
    Case(
        "megatron-actor-tp",
        ["actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"],
        {"megatron-rollout-parallel", "rollout-n"},  # DP halves, so n must follow
        "megatron",
    ),
    Case(
        "megatron-cp", ["actor_rollout_ref.actor.megatron.context_parallel_size=2"], {"sequence-parallel"}, "megatron"
    ),
    Case(
        "trim-with-is",
        ["algorithm.rollout_correction.rollout_is=token"],
        {"rollout-correction"},
        env={"PROMPTS_ONLY": "trim"},
    ),
    Case(
        "trim-with-rs",
        ["algorithm.rollout_correction.rollout_rs=token_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.5"],
        {"rollout-correction"},
        env={"PROMPTS_ONLY": "trim"},
    ),
    Case("is-without-trim", ["algorithm.rollout_correction.rollout_is=token"], set(), env={"PROMPTS_ONLY": "1"}),
    Case("megatron-prompt-forward", [], set(), "megatron", env={"PROMPTS_ONLY": "1"}),
    Case(
        "megatron-prompt-forward-router-replay",
        ["actor_rollout_ref.actor.megatron.router_replay.mode=R3"],
        {"megatron-prompts-only"},
        "megatron",
        env={"PROMPTS_ONLY": "1"},
    ),
    Case(
        "megatron-prompt-forward-dynamic-cp",
        ["actor_rollout_ref.actor.megatron.dynamic_context_parallel=True"],
        {"megatron-prompts-only"},
        "megatron",
        env={"PROMPTS_ONLY": "1"},
    ),
    Case(
        "megatron-trim-router-replay",
        ["actor_rollout_ref.actor.megatron.router_replay.mode=R3"],
        set(),  # trim runs no extra forward
        "megatron",
        env={"PROMPTS_ONLY": "trim"},
    ),
    Case(
        "megatron-pp-trims-itself",
        ["actor_rollout_ref.rollout.pipeline_model_parallel_size=2"]
        + [f"actor_rollout_ref.{role}.megatron.pipeline_model_parallel_size=2" for role in ("actor", "ref")],
        {"rollout-n"},  # PP halves DP; PROMPTS_ONLY=1 is trim with PP > 1, so no prompts-only finding
        "megatron",
        env={"PROMPTS_ONLY": "1"},
    ),
    Case(
        "megatron-virtual-pipeline",
        ["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=2"],
        {"virtual-pipeline"},
        "megatron",
    ),
    Case(
        "megatron-virtual-pipeline-one",
        ["actor_rollout_ref.actor.megatron.virtual_pipeline_model_parallel_size=1"],
        set(),  # one chunk per rank: off
        "megatron",
    ),
    Case("fsdp-prompt-forward", [], set(), env={"PROMPTS_ONLY": "1"}),
    Case(
        "megatron-pp-trim-with-is",
        ["actor_rollout_ref.rollout.pipeline_model_parallel_size=2", "algorithm.rollout_correction.rollout_is=token"]
        + [f"actor_rollout_ref.{role}.megatron.pipeline_model_parallel_size=2" for role in ("actor", "ref")],
        {"rollout-n", "rollout-correction"},
        "megatron",
        env={"PROMPTS_ONLY": "1"},
    ),
    Case("bypass", ["algorithm.rollout_correction.bypass_mode=True"], {"log-prob-recomputed"}),
    Case(
        "bypass-update-phase",
        ["algorithm.rollout_correction.bypass_mode=True"],
        set(),
        env={"DUMP_PHASE": "update_actor"},
    ),
    Case("native-debugger", ["global_profiler.tool=precision_debugger"], {"native-precision-debugger"}),
    Case(
        "native-debugger-actor",
        ["actor_rollout_ref.actor.profiler.tool=precision_debugger"],
        {"native-precision-debugger"},
    ),
    Case(
        "ascend-no-dump", [], {"inference-dump-config"}, drop_overrides=("++actor_rollout_ref.rollout.engine_kwargs",)
    ),
    Case(
        "ascend-missing-file",
        ["++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=/no/such/gen.json"],
        {"inference-dump-config"},
        fixable=False,
    ),
    Case("gpu-vllm-no-dump", [], {"inference-dump-config"}, rollout="vllm", drop_env=("MSPROBE_GENERATE_CONFIG",)),
    Case("sglang-no-dump", [], {"inference-dump-config"}, rollout="sglang", drop_env=("MSPROBE_GENERATE_CONFIG",)),
    Case(
        "unsupported-rollout",
        ["actor_rollout_ref.rollout.name=hf"],
        {"inference-dump-config"},
        rollout="",
        fixable=False,
    ),
]


def _compose(backend: str, overrides: list[str]):
    engine = ["model_engine=megatron"] if backend == "megatron" else []
    return verl_config.compose(
        verl_config.verl_config_dir(), "ppo_trainer", [*engine, "actor_rollout_ref.rollout.name=vllm", *overrides]
    )


def _recipe(case: Case, generate_config: str) -> recipe.Recipe:
    return recipe.build(case.backend, GPUS, rollout=case.rollout or "vllm-ascend", generate_config=generate_config)


def _check(case: Case, overrides: list[str], environ: dict[str, str]) -> list[preflight.Finding]:
    config = _compose(case.backend, overrides)
    return preflight.check(config, config_module.load(environ), environ, case.rollout or None)


def _start(case: Case, generate_config: str) -> tuple[list[str], dict[str, str]]:
    made = _recipe(case, generate_config)
    overrides = [o for o in made.overrides if not any(o.startswith(prefix) for prefix in case.drop_overrides)]
    if case.rollout == "sglang":
        overrides.append("actor_rollout_ref.rollout.name=sglang")
    environ = {k: v for k, v in {**made.environ, **case.env}.items() if k not in case.drop_env}
    return overrides, environ


@pytest.mark.parametrize("backend", ["fsdp", "megatron"])
@pytest.mark.parametrize("rollout", preflight.ROLLOUT_BACKENDS)
def test_the_recipe_satisfies_every_rule(backend, rollout, generate_config):
    case = Case("recipe", [], set(), backend, rollout, env={"PROMPTS_ONLY": "trim"})
    overrides, environ = _start(case, generate_config)
    assert _check(case, overrides, environ) == []


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_each_rule_fires_on_its_violation_and_its_fix_clears_it(case, generate_config):
    overrides, environ = _start(case, generate_config)
    findings = _check(case, [*overrides, *case.overrides], environ)
    assert {f.rule for f in findings} == case.rules
    for finding in findings:
        assert finding.why and finding.fix and finding.problem
        assert "\n" not in finding.line()
    if not case.fixable or not findings:
        return
    fixed_env = dict(environ)
    fixes = []
    # The user puts their own inference config where the fix shows a placeholder.
    for fix in (f.replace(preflight.GENERATE_CONFIG_PLACEHOLDER, generate_config) for g in findings for f in g.fix):
        if fix.startswith("export "):
            name, _, value = fix.removeprefix("export ").partition("=")
            fixed_env[name] = value
        else:
            fixes.append(fix)
    assert _check(case, [*overrides, *case.overrides, *fixes], fixed_env) == []


def test_a_finding_names_every_wrong_value_with_what_it_needs(generate_config):
    case = Case("batch", [], set())
    overrides, environ = _start(case, generate_config)
    findings = _check(
        case, [*overrides, "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4"], environ
    )
    (finding,) = findings
    assert "data.train_batch_size is 8, needs 1" in finding.problem
    assert "actor_rollout_ref.actor.ppo_mini_batch_size is 4, needs 1" in finding.problem
    assert finding.fix == ("data.train_batch_size=1", "actor_rollout_ref.actor.ppo_mini_batch_size=1")


def test_verl_defaults_break_many_rules_and_all_are_listed_at_once(generate_config):
    environ = {}
    config = _compose("fsdp", [])
    rules = {f.rule for f in preflight.check(config, config_module.load(environ), environ, "vllm-ascend")}
    expected = {"batch-size", "rollout-n", "balance-batch", "val-before-train", "eager-rollout", "torchdynamo"}
    expected |= {"prefix-caching", "chunked-prefill", "fsdp-rollout-parallel", "inference-dump-config"}
    assert rules == expected


def test_interpolated_role_profilers_follow_the_global_tool(generate_config):
    case = Case("native", [], set())
    overrides, environ = _start(case, generate_config)
    (finding,) = _check(case, [*overrides, "global_profiler.tool=precision_debugger"], environ)
    assert finding.fix == ("global_profiler.tool=null",)


def test_ray_runtime_env_also_satisfies_torchdynamo(generate_config):
    case = Case("dynamo-in-ray-env", [], set(), drop_env=("TORCHDYNAMO_DISABLE",))
    overrides, environ = _start(case, generate_config)
    ray_env = "+ray_kwargs.ray_init.runtime_env.env_vars.TORCHDYNAMO_DISABLE='1'"
    assert _check(case, [*overrides, ray_env], environ) == []


def test_a_cluster_started_apart_needs_the_hooks_in_the_jobs_runtime_env(generate_config):
    case = Case("ray", [], set(), env={"RAY_ADDRESS": "127.0.0.1:6379"})
    overrides, environ = _start(case, generate_config)
    (finding,) = _check(case, overrides, environ)
    assert "joins the Ray cluster at 127.0.0.1:6379, started apart" in finding.problem
    assert "DUMP_ON=1 and PYTHONPATH with the shim's folder (sitecustomize_shim)" in finding.problem
    assert "msprobe-hooks ray-env" in finding.fix[0]
    # What `msprobe-hooks ray-env` prints clears it (an env_vars PYTHONPATH naming the shim's folder, DUMP_ON=1).
    ray_env = [f"++{rules.RAY_ENV_VARS}.PYTHONPATH='{shim_dir()}:/opt/a'", f"++{rules.RAY_ENV_VARS}.DUMP_ON='1'"]
    assert _check(case, [*overrides, *ray_env], environ) == []
    assert _check(case, [*overrides, ray_env[0]], environ)[0].problem.endswith("lacks DUMP_ON=1, so no worker dumps")
    local = Case("local", ["+ray_kwargs.ray_init.address=local"], set(), env={"RAY_ADDRESS": "127.0.0.1:6379"})
    assert _check(local, [*_start(local, generate_config)[0], *local.overrides], environ) == []


def test_a_missing_dump_config_file_is_reported_with_the_key_and_the_path(generate_config):
    case = Case("missing", [], set())
    overrides, environ = _start(case, generate_config)
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path"
    (finding,) = _check(case, [*overrides, f"++{key}=/no/such/gen.json"], environ)
    assert f"{key}='/no/such/gen.json' is not valid (no such file)" in finding.problem


@pytest.mark.parametrize(
    ("rollout", "extra", "environ", "ok"),
    [
        ("sglang", ["++actor_rollout_ref.rollout.engine_kwargs.sglang.msprobe_dump_config=GEN"], {}, True),
        ("sglang", [], {"MSPROBE_GENERATE_CONFIG": "GEN"}, True),
        ("vllm", [], {"MSPROBE_GENERATE_CONFIG": "GEN"}, True),
        ("vllm", ["++actor_rollout_ref.rollout.engine_kwargs.vllm.additional_config.dump_config_path=GEN"], {}, False),
        ("vllm-ascend", [], {"MSPROBE_GENERATE_CONFIG": "GEN"}, False),
    ],
    ids=["sglang-native", "sglang-variable", "gpu-vllm-variable", "gpu-vllm-ascend-key", "ascend-variable"],
)
def test_which_dump_config_counts_depends_on_the_rollout_backend(rollout, extra, environ, ok, generate_config):
    case = Case("dump", [], set(), rollout=rollout)
    overrides = [o for o in _recipe(case, generate_config).overrides if "engine_kwargs" not in o]
    if rollout == "sglang":
        overrides.append("actor_rollout_ref.rollout.name=sglang")
    extra = [o.replace("GEN", generate_config) for o in extra]
    environ = {"TORCHDYNAMO_DISABLE": "1", **{k: v.replace("GEN", generate_config) for k, v in environ.items()}}
    rules = {f.rule for f in _check(case, [*overrides, *extra], environ)}
    assert rules == (set() if ok else {"inference-dump-config"})


def test_an_unreadable_interpolation_is_reported_on_its_key(generate_config):
    case = Case("interp", [], set())
    overrides, environ = _start(case, generate_config)
    findings = _check(case, [*overrides, "trainer.balance_batch=${oc.env:NO_SUCH_VARIABLE_FOR_PREFLIGHT}"], environ)
    (finding,) = findings
    assert finding.rule == "balance-batch"
    assert "trainer.balance_batch is unreadable" in finding.problem


@pytest.mark.parametrize(
    ("overrides", "installed", "expected"),
    [
        (["actor_rollout_ref.rollout.name=vllm", "trainer.device=npu"], False, "vllm-ascend"),
        (["actor_rollout_ref.rollout.name=vllm"], True, "vllm-ascend"),
        (["actor_rollout_ref.rollout.name=vllm"], False, "vllm"),
        (["actor_rollout_ref.rollout.name=sglang", "trainer.device=npu"], True, "sglang"),
        (["actor_rollout_ref.rollout.name=trtllm"], False, "trtllm"),
        ([], False, "unset"),
    ],
)
def test_rollout_backend_comes_from_the_config_and_the_installed_packages(overrides, installed, expected, monkeypatch):
    monkeypatch.setattr(findings, "installed", lambda module: installed and module == "vllm_ascend")
    config = verl_config.compose(verl_config.verl_config_dir(), "ppo_trainer", overrides)
    assert preflight.rollout_backend(config) == expected
    assert preflight.rollout_backend(config, "sglang") == "sglang"


def test_a_missing_rollout_name_is_a_finding(generate_config):
    config = verl_config.compose(verl_config.verl_config_dir(), "ppo_trainer", [])
    findings = preflight.check(config, config_module.load({}), {}, None)
    (dump,) = [f for f in findings if f.rule == "inference-dump-config"]
    assert "actor_rollout_ref.rollout.name is not set" in dump.problem


def test_only_ppo_configs_are_checked():
    assert preflight.is_ppo_config(_compose("fsdp", []))
    assert not preflight.is_ppo_config(OmegaConf.create({"trainer": {"device": "cuda"}, "model": {}}))
    assert not preflight.is_ppo_config({"actor_rollout_ref": {"rollout": {}}})


def test_report_has_a_header_and_one_line_per_finding():
    findings = [
        preflight.Finding("a", "x is 1, needs 2", "because", ("x=2",)),
        preflight.Finding("b", "p", "w", ("f",)),
    ]
    lines = preflight.report(findings, "run.yaml")
    assert lines[0].startswith("msprobe-hooks preflight: run.yaml: 2 findings")
    assert lines[1:] == ["  [a] x is 1, needs 2: because; fix: x=2", "  [b] p: w; fix: f"]
    assert preflight.report([], "run.yaml") == [
        f"msprobe-hooks preflight: run.yaml: no findings ({len(preflight.RULES)} rules)"
    ]


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "null"), (True, "True"), (False, "False"), (4, "4"), ("/a/b-c.json", "/a/b-c.json"), ("a b", "'a b'")],
)
def test_hydra_values_are_written_as_overrides_parse_them(value, text):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert preflight.hydra_value(value) == text
    assert OverridesParser.create().parse_override(f"k={text}").value() == value


def test_rule_names_are_unique():
    names = [rule.name for rule in preflight.RULES]
    assert len(names) == len(set(names))


def test_the_virtual_pipeline_rule_gives_the_engine_patchs_reason():
    (rule,) = [rule for rule in preflight.RULES if rule.name == "virtual-pipeline"]
    assert virtual_pipeline.REASON in rule.why
    assert f"(2 model chunks per rank) is not supported: {virtual_pipeline.REASON};" in virtual_pipeline.refusal(2)
