"""The training side: actor micro-batch dumps and their log, prompts-only collection, rollout request ids.

Engine-independent: the verl patches (:mod:`msprobe_hooks.patches.verl`) call into it.
"""
