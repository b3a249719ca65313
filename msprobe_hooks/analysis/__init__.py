"""The analysis side: ``align`` and ``compare``, in four stages over a ground.

The stages, in order, each importing only those before it and the ground: ``pairing`` (the hooks' logs read,
training dumps paired with inference dumps, the pairs file), ``comparing`` (each pair's tensors compared across the
engines' names), ``answer`` (verdicts, causes, the run across global steps), ``report`` (the files). The ground, at
this folder's root, imports no stage: ``results`` (the answer's vocabulary), ``table`` (the report's tables) and
``dumpfile`` (the ``dump.json`` reader). ``run`` runs the whole of ``compare``.

Nothing here imports verl or an inference engine: these commands run on an analysis machine with msprobe-hooks'
declared dependencies alone. torch, not one of them, is imported only to load and compare the tensors of
tensor-mode dumps (statistics dumps need none), Ray only for ``compare --ray``.
"""
