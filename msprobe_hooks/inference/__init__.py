"""The inference side: the dispatch log every engine patch writes, one line per model step.

Engine-independent: the vLLM and SGLang patches (:mod:`msprobe_hooks.patches.vllm`,
:mod:`msprobe_hooks.patches.sglang`) call into it.
"""
