"""verl's own trainer, ``python3 -m verl.trainer.main_ppo``, on CPU: its inputs, its overrides, one run.

    .venv-verl-e2e/bin/python -m cpu_kit.main_ppo WORK [--legacy] [--steps 2] [OVERRIDE ...]

(from the repository root, in the venv of ``make install-verl-e2e``) writes the inputs under
``WORK/inputs`` (:func:`build_inputs`: a tiny random Qwen2 with a byte-level BPE tokenizer verl's chat
path accepts, a parquet of four prompts) and runs verl's trainer, unchanged, in its own process group:
Ray, the v1 trainer and TransferQueue (``--legacy``: ``RayPPOTrainer.fit``), the agent loop, vLLM CPU as
an async rollout server in a Ray actor, the FSDP2 actor, the weight sync after every step. verl's
console goes to ``WORK/main_ppo.log``, its metrics (the file logger) to ``WORK/metrics.jsonl``, the exit status and
wall time to ``WORK/run.json`` (:meth:`Run.of`).

What makes it run on a CPU: the plugin :mod:`cpu_kit.verl_main_ppo_cpu` (``VERL_USE_EXTERNAL_MODULES``),
the variables of :func:`environment` and the overrides of :func:`overrides`. The overrides start with
``msprobe-hooks recipe``'s for this shape (one FSDP card, vLLM), so verl's preflight passes when the
hooks are on. The hooks are never switched on here: the caller's environment is passed through (the shim
first on PYTHONPATH, ``DUMP_ON=1``, ``MSPROBE_GENERATE_CONFIG``, ...; docs/verl-main-ppo.md).

``--cluster``: the job joins a Ray cluster started apart, as on a multi-node cluster. ``ray start --head`` (local
addresses) in the environment of the cluster's administrator, the caller's without the hooks (no ``DUMP_ON``, no
shim on PYTHONPATH, none of the hooks' variables), and the job given ``msprobe-hooks ray-env``'s overrides, run as
the user guide says: the hooks reach Ray's workers only through the job's ``runtime_env``.

A run that outlives ``--timeout`` is killed with its whole session (a failed weight sync hangs rather than exits),
and so is whatever of the session outlives a run that ended; the same for the cluster.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGIN = "cpu_kit.verl_main_ppo_cpu"
REWARD = Path(__file__).with_name("main_ppo_reward.py")
# Character-level prompts: about 30 tokens each with the chat template's.
PROMPTS = ("add 3 to 4", "spell tea", "count to 5", "name a cat")
MAX_PROMPT_LENGTH = 48
MAX_RESPONSE_LENGTH = 8
# Measured on the shared 2-core machine: ~4 min a run (Ray, FSDP init, vLLM's start and profile run).
TIMEOUT_S = 900
# The chat specials verl's Qwen chat path needs; <|im_end|> is the model's eos (verl_cpu.EOS_TOKEN_ID).
SPECIALS = ("<|endoftext|>", "<|im_end|>", "<|im_start|>")
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def write_chat_tokenizer(path: str | os.PathLike) -> None:
    """A byte-level BPE tokenizer of the kit's vocabulary size saved under ``path``, as ``Qwen2Tokenizer`` loads it.

    For ``model_type`` qwen2, transformers 5 loads any tokenizer folder as ``Qwen2Tokenizer`` (BPE): the
    kit's WordLevel one then encodes everything to ``[]``. verl's chat path also needs ``"\\n"`` as one
    token and ``<|im_end|>``. Here: the three specials (ids 0, 1, 2: pad, eos, start), ``\\n`` and every
    printable ASCII character as byte-level symbols, one merge (`` t``), Latin-1 symbols up to
    :data:`cpu_kit.verl_cpu.VOCAB_SIZE`, a ChatML-like template.
    """
    from tokenizers import AddedToken
    from transformers import Qwen2Tokenizer

    from cpu_kit import verl_cpu

    symbols = ["Ċ", "Ġ", *(chr(c) for c in range(33, 127)), "Ġt"]  # byte-level: "\n" is Ċ, " " is Ġ
    # Byte-level symbols of Latin-1 bytes (themselves) up to the model's vocabulary: verl bans the rollout's
    # ids past the tokenizer's (monkey_patch_compute_logits), not training's, and on a random model the
    # 28 missing ids alone would move every rollout log-prob by log(128 / 100).
    symbols += [chr(c) for c in range(161, 161 + verl_cpu.VOCAB_SIZE - len(SPECIALS) - len(symbols))]
    vocab = {token: i for i, token in enumerate([*SPECIALS, *symbols])}
    tokenizer = Qwen2Tokenizer(
        vocab=vocab, merges=[("Ġ", "t")], unk_token=None, bos_token=None, eos_token=SPECIALS[1], pad_token=SPECIALS[0]
    )
    tokenizer.add_tokens([AddedToken(token, special=True) for token in SPECIALS], special_tokens=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(os.fspath(path))


@dataclass(frozen=True)
class Inputs:
    model: Path
    data: Path  # the training (and validation) parquet


def build_inputs(folder: Path) -> Inputs:
    """``folder/model`` (the kit's tiny Qwen2, :func:`cpu_kit.verl_cpu.build_model_dir`, with
    :func:`write_chat_tokenizer`'s tokenizer) and ``folder/train.parquet`` (verl's RL dataset columns)."""
    import pandas

    from cpu_kit import verl_cpu

    model = Path(verl_cpu.build_model_dir(os.fspath(folder / "model")))
    write_chat_tokenizer(model)
    rows = [
        {
            "data_source": "cpu_kit",
            "prompt": [{"role": "user", "content": prompt}],
            "ability": "none",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"split": "train", "index": i},
        }
        for i, prompt in enumerate(PROMPTS)
    ]
    data = folder / "train.parquet"
    pandas.DataFrame(rows).to_parquet(data)
    return Inputs(model, data)


def recipe_overrides() -> list[str]:
    """``msprobe-hooks recipe --backend fsdp --gpus 1 --rollout vllm``'s overrides: what verl's preflight asks."""
    from msprobe_hooks.preflight.recipe import build

    return build("fsdp", 1, rollout="vllm").overrides


def overrides(inputs: Inputs, work: Path, ray: list[str], *, steps: int, legacy: bool) -> list[str]:
    """The recipe's, then the CPU's (the last value of a key wins); ``ray``: :func:`local_ray`, :func:`cluster_ray`."""
    actor, rollout = "actor_rollout_ref.actor", "actor_rollout_ref.rollout"
    return [
        *recipe_overrides(),
        # The recipe's batch of one prompt and one response: a group advantage (GRPO) would be 0. REINFORCE++
        # with gamma < 1 whitens the decayed returns over the response's tokens: non-zero.
        "algorithm.adv_estimator=reinforce_plus_plus",
        "algorithm.gamma=0.5",
        f"data.train_files={inputs.data}",
        f"data.val_files={inputs.data}",
        f"data.max_prompt_length={MAX_PROMPT_LENGTH}",
        f"data.max_response_length={MAX_RESPONSE_LENGTH}",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={inputs.model}",
        "+actor_rollout_ref.model.override_config.attn_implementation=eager",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        f"{actor}.strategy=fsdp2",
        f"{actor}.use_torch_compile=False",
        f"{actor}.fsdp_config.use_torch_compile=False",
        f"{actor}.optim.lr=1e-4",  # moves the tiny model's outputs far above fp32 noise (cpu_kit.rl_loop)
        # fp32 really: model_dtype alone leaves FSDP's mixed precision at its default, a bf16 forward.
        f"{actor}.fsdp_config.model_dtype=fp32",
        f"{actor}.fsdp_config.dtype=float32",
        f"+{actor}.fsdp_config.mixed_precision={{param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}}",
        f"{rollout}.name=vllm",
        f"{rollout}.dtype=float32",
        f"{rollout}.max_model_len={MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH}",
        f"{rollout}.load_format=auto",
        f"+{rollout}.enable_sleep_mode=False",  # not in the yaml; True is refused on a CPU
        f"{rollout}.free_cache_engine=False",
        "reward.num_workers=1",
        f"reward.custom_reward_function.path={REWARD}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.device=cpu",
        f"trainer.use_v1={not legacy}",
        f"trainer.total_training_steps={steps}",
        "trainer.logger=[console,file]",
        "trainer.save_freq=-1",
        "trainer.test_freq=-1",
        f"trainer.default_local_dir={work / 'checkpoints'}",
        *ray,
        "transfer_queue.backend.SimpleStorage.num_data_storage_units=1",
    ]


# Ray's CPUs are bookkeeping: TransferQueue's controller and storage unit, the TaskRunner and the actor's bundle
# ask for one each (fewer hangs the v1 trainer); one logical GPU for the pools.
RAY_CPUS, RAY_GPUS = 8, 1


def local_ray(ray_temp: str) -> list[str]:
    """The overrides of a cluster ``ray.init`` starts in the driver (its workers inherit the driver's environment)."""
    return [
        f"+ray_kwargs.ray_init.num_cpus={RAY_CPUS}",
        f"+ray_kwargs.ray_init.num_gpus={RAY_GPUS}",
        f"+ray_kwargs.ray_init._temp_dir={ray_temp}",
        "+ray_kwargs.ray_init.include_dashboard=False",
    ]


def cluster_ray(address: str, job_env: dict[str, str]) -> list[str]:
    """The overrides of a job joining the cluster at ``address``: the address, and the runtime_env that
    ``msprobe-hooks ray-env`` prints in the job's shell, taken as the user guide says (a bash array)."""
    printed = subprocess.run(
        ["bash", "-c", 'eval "RAY_ENV=($(msprobe-hooks ray-env))" && printf "%s\\0" "${RAY_ENV[@]}"'],
        env={**job_env, "PATH": os.pathsep.join([os.path.dirname(sys.executable), job_env.get("PATH", "")])},
        capture_output=True,
        text=True,
        check=True,
    )
    return [f"+ray_kwargs.ray_init.address={address}", *printed.stdout.split("\0")[:-1]]


def cluster_environment(job_env: dict[str, str]) -> dict[str, str]:
    """The environment of a cluster started apart: the job's without the hooks, as its administrator's shell."""
    from msprobe_hooks import config

    env = {name: value for name, value in job_env.items() if name not in _hooks_variables()}
    paths = job_env.get("PYTHONPATH", "").split(os.pathsep)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in paths if p and os.path.basename(os.path.normpath(p)) != config.SHIM_PACKAGE
    )
    # Ray turns token authentication on when ~/.ray/auth_token exists, but a driver joining by address does not
    # send it: the cluster is local and private, so off, whatever the machine's home holds.
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def cluster_facts(address: str, env: dict[str, str]) -> dict[str, object]:
    """What ``WORK/cluster.json`` says of the cluster: its address, PYTHONPATH and which hooks' variables it had."""
    return {
        "address": address,
        "PYTHONPATH": env.get("PYTHONPATH", ""),
        "hooks_variables": sorted(_hooks_variables() & set(env)),
    }


def _hooks_variables() -> set[str]:
    from msprobe_hooks import config

    return {variable.name for variable in config.VARIABLES}


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def ray_cluster(env: dict[str, str], ray_temp: str, log: Path) -> Iterator[str]:
    """``ray start --head`` in ``env`` and a session of its own, its output to ``log``; yields the address, then
    kills the session. The ports Ray would fix are chosen free (other clusters may run on the machine)."""
    port = _free_port()
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    with log.open("w") as out:
        started = subprocess.Popen(
            [ray, "start", "--head", f"--port={port}", f"--ray-client-server-port={_free_port()}",
             f"--dashboard-agent-listen-port={_free_port()}", f"--num-cpus={RAY_CPUS}", f"--num-gpus={RAY_GPUS}",
             f"--temp-dir={ray_temp}", "--include-dashboard=false", "--disable-usage-stats"],
            env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    try:
        # `ray start` returns once the cluster is up; its processes stay in its session.
        if started.wait(timeout=300) != 0:
            raise RuntimeError(f"ray start exited {started.returncode}: {log}")
        yield f"127.0.0.1:{port}"
    finally:
        kill_session(started.pid)
        started.wait()


def kill_session(sid: int, timeout_s: float = 10.0) -> None:
    """SIGKILL every live process of session ``sid`` and wait until each has exited (up to ``timeout_s`` a pass):
    the kernel ends a killed process only once it next runs, which on a busy machine is later. Not the process
    group: Ray's workers put themselves in groups of their own. A few passes, as a process may fork while the
    others are being killed."""
    for _ in range(3):
        alive = [pid for pid in _processes() if _live_session(pid) == sid]
        if not alive:
            return
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        _wait_exited(alive, time.monotonic() + timeout_s)


def _wait_exited(pids: Sequence[int], deadline: float) -> None:
    """Until each of ``pids`` has exited (a zombie has) or ``deadline`` passes: a pidfd is readable once it has."""
    for pid in pids:
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            select.select([handle], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(handle)


def _processes() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _live_session(pid: int) -> int | None:
    """The session of ``pid``, None once it is gone or a zombie (nothing left to kill)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, _, _, session = stat.rpartition(")")[2].split()[:4]  # after the command's name, which may hold spaces
    return None if state in "ZX" else int(session)


def environment(work: Path, rpc_dir: str) -> dict[str, str]:
    """The caller's environment (the hooks' variables with it) and what the CPU run needs."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), os.fspath(REPO)]))  # the shim stays first
    env["VERL_USE_EXTERNAL_MODULES"] = PLUGIN
    env["VERL_ENGINE_DEVICE"] = "cuda"  # verl's engine registry lists FSDP for cuda/npu: the same classes
    env["VERL_FILE_LOGGER_PATH"] = os.fspath(work / "metrics.jsonl")
    env["VLLM_TARGET_DEVICE"] = "cpu"
    env["VLLM_RPC_BASE_PATH"] = rpc_dir  # vLLM's IPC sockets: a private folder, removed after the run
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB
    env.setdefault("TORCHDYNAMO_DISABLE", "1")
    env.setdefault("WANDB_MODE", "disabled")
    env.setdefault("HYDRA_FULL_ERROR", "1")
    return env


@dataclass(frozen=True)
class Run:
    work: Path
    returncode: int
    timed_out: bool
    wall_s: float

    @classmethod
    def of(cls, work: Path) -> Run:
        """The run :func:`run` made in ``work`` (its ``run.json``)."""
        return cls(work=work, **json.loads((work / "run.json").read_text()))

    @property
    def log(self) -> Path:
        return self.work / "main_ppo.log"

    def metrics(self) -> dict[int, dict[str, float]]:
        """verl's metrics of each global step (its file logger), by step."""
        path = self.work / "metrics.jsonl"
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        return {line["step"]: line["data"] for line in lines}


def run(
    work: Path,
    *extra: str,
    steps: int = 2,
    legacy: bool = False,
    cluster: bool = False,
    python: str = sys.executable,
    timeout: float = TIMEOUT_S,
) -> Run:
    """``python -m verl.trainer.main_ppo`` on the kit's inputs in ``work``; ``extra`` overrides go last.
    ``cluster``: the job joins a cluster :func:`ray_cluster` started apart (``WORK/cluster.json``,
    ``WORK/ray_start.log``)."""
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    inputs = build_inputs(work / "inputs")
    # Short paths: Ray's and vLLM's socket paths must stay under 107 bytes.
    ray_temp, rpc_dir = tempfile.mkdtemp(prefix="ray"), tempfile.mkdtemp(prefix="vllm-rpc")
    env = environment(work, rpc_dir)
    began = time.perf_counter()
    timed_out = False
    try:
        with contextlib.ExitStack() as stack:
            if cluster:
                apart = cluster_environment(env)
                address = stack.enter_context(ray_cluster(apart, ray_temp, work / "ray_start.log"))
                ray = cluster_ray(address, env)
                (work / "cluster.json").write_text(json.dumps(cluster_facts(address, apart), indent=1))
            else:
                ray = local_ray(ray_temp)
            command = [python, "-m", "verl.trainer.main_ppo", *overrides(inputs, work, ray, steps=steps, legacy=legacy)]
            (work / "command.json").write_text(json.dumps(command, indent=1))
            log = stack.enter_context((work / "main_ppo.log").open("w"))
            # A session of its own: Ray's and vLLM's processes stay in it, whatever process group they take.
            process = subprocess.Popen(
                [*command, *extra], env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                kill_session(process.pid)
                process.wait()
    finally:
        shutil.rmtree(ray_temp, ignore_errors=True)
        shutil.rmtree(rpc_dir, ignore_errors=True)
    done = Run(work, process.returncode, timed_out, time.perf_counter() - began)
    (work / "run.json").write_text(
        json.dumps({"returncode": done.returncode, "timed_out": timed_out, "wall_s": done.wall_s})
    )
    return done


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("work", type=Path, help="folder for the inputs, verl's log and metrics")
    parser.add_argument("--steps", type=int, default=2, help="global steps (default 2)")
    parser.add_argument("--legacy", action="store_true", help="the legacy trainer (trainer.use_v1=False)")
    parser.add_argument("--cluster", action="store_true", help="join a Ray cluster started apart (ray start --head)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help=f"seconds (default {TIMEOUT_S})")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides, after the kit's")
    args = parser.parse_intermixed_args(argv)  # overrides before or after the options
    done = run(
        args.work, *args.overrides, steps=args.steps, legacy=args.legacy, cluster=args.cluster, timeout=args.timeout
    )
    state = "timed out, killed" if done.timed_out else f"exit {done.returncode}"
    print(f"main_ppo: {state} after {done.wall_s:.0f} s; log {done.log}")
    for step, metrics in sorted(done.metrics().items()):
        timing = metrics.get("timing_s/step", float("nan"))
        gap = metrics.get("training/rollout_probs_diff_max", float("nan"))
        print(f"global step {step}: {timing:.1f} s, training/rollout_probs_diff_max {gap:.3g}")
    return 0 if done.returncode == 0 and not done.timed_out else 1


if __name__ == "__main__":
    sys.exit(main())
