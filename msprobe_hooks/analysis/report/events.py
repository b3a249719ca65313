"""The run view as TensorBoard scalars (``compare --tensorboard DIR``), where users already look.

verl's ``trainer.logger`` writes TensorBoard event files besides W&B; pointing TensorBoard at ``DIR``
(or at the run's log folder holding it) shows, per global step, ``msprobe_hooks/<scalar>`` beside the
job's own ``training/rollout_probs_diff_*``. Written with TensorBoard's own event-file writer and
protocol buffers (the ``tensorboard`` package; no TensorFlow, no torch).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from msprobe_hooks.analysis.answer.run_view import StepView

TAG_PREFIX = "msprobe_hooks"


def tag(scalar: str, layer: int | None) -> str:
    """The scalar's TensorBoard tag: ``msprobe_hooks/largest_error``, ``msprobe_hooks/layer_error/L3``."""
    return f"{TAG_PREFIX}/{scalar}" + (f"/L{layer}" if layer is not None else "")


def write(folder: str, views: Sequence[StepView]) -> str:
    """One event file in ``folder`` with every step's scalars (steps without an integer global step are left
    out: TensorBoard's step axis is an integer); returns the file's path."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(folder, filename_suffix=".msprobe_hooks")
    try:
        for view in views:
            if not isinstance(view.global_step, int):
                continue
            values = [Summary.Value(tag=tag(name, layer), simple_value=value) for name, layer, value in view.scalars()]
            writer.add_event(Event(wall_time=time.time(), step=view.global_step, summary=Summary(value=values)))
        writer.flush()
    finally:
        writer.close()
    return writer.get_logdir()
