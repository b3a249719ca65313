"""The CPU kit the demo, the tests and the benchmarks share (one copy, imported by all three).

* :mod:`cpu_kit.verl_cpu`: verl's real FSDP2 training engine on CPU (a tiny random Qwen2 model
  folder, gloo, fp32, eager attention);
* :mod:`cpu_kit.demo_inputs`: the whole-loop demo's inputs (a model, a copy with one planted
  fault, prompts) and the prompts file both sides read;
* :mod:`cpu_kit.moe_inputs`: beyond the dense Qwen2: a tiny Qwen3, Qwen3-MoE and Qwen2-MoE, copies with
  numeric faults, and the router-fault planting device (a known share of tokens sent to other experts);
* :mod:`cpu_kit.vllm_engine`, :mod:`cpu_kit.sglang_engine`: a long-lived real vLLM (``.venv-vllm``) or SGLang
  (``.venv-sglang``) engine over the JSON lines of :mod:`cpu_kit.engine_server`: generate with log-probs, weights
  handed over to the running engine; and its client;
* :mod:`cpu_kit.rl_loop`: the RL loop over both engines (rollout, log-prob pass, update, weight
  hand-over) for as many global steps as asked, with a planted sync fault on request, and real causes put on
  the rollout only (a temperature, an fp8 KV cache, vLLM's ``hf_overrides``, SGLang's log-probs mode and model
  override, a prompt re-tokenized);
* :mod:`cpu_kit.main_ppo`: verl's own trainer (``python -m verl.trainer.main_ppo``) run on CPU, vLLM CPU as
  its rollout (``.venv-verl-e2e``): its inputs, its overrides, a launcher; :mod:`cpu_kit.verl_main_ppo_cpu`, the
  plugin verl loads in each of its processes (``VERL_USE_EXTERNAL_MODULES``), and ``main_ppo_reward.py``, its reward;
* ``cpu_kit/vllm_decode_fault/``: a vLLM plugin package (installed into ``.venv-vllm`` by
  ``make install-vllm``) that plants a decode-only fault when ``CPU_KIT_DECODE_FAULT`` is set.

Not part of the ``msprobe_hooks`` distribution: examples and benchmarks put the repository root
on ``sys.path``, and so does ``pyproject.toml`` for pytest.
"""
