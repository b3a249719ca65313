"""Stage 4, the report: the answer written as ``summary.md``, the CSV tables, the figures, ``index.html`` and
TensorBoard event files. The last stage: nothing before it imports it."""
