"""The CPU kit the demo, the tests and the benchmarks share (one copy, imported by all three).

* :mod:`cpu_kit.verl_cpu`: verl's real FSDP2 training engine on CPU (a tiny random Qwen2 model
  folder, gloo, fp32, eager attention);
* :mod:`cpu_kit.demo_inputs`: the whole-loop demo's inputs (a model, a copy with one planted
  fault, prompts) and the prompts file both sides read.

Not part of the ``msprobe_hooks`` distribution: examples and benchmarks put the repository root
on ``sys.path``, and so does ``pyproject.toml`` for pytest.
"""
