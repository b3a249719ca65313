"""The answer side: ``align`` pairs training dumps with inference prefill dumps, ``compare`` finds
the first module where they diverge and writes the report.

Nothing here imports torch, verl or an inference engine: these commands run on an analysis
machine with msprobe-hooks' declared dependencies alone (msprobe brings pandas, matplotlib, tqdm).
"""
