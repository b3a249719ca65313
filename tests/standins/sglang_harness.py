"""Drives an SGLang stand-in the way SGLang's scheduler process does.

Requests come in waves; each wave is prefilled (in chunks when ``chunk_size`` is set, mixed with
the running requests' decode when ``server_args.enable_mixed_chunk``), prompts already prefilled
are found again by a toy radix cache (unless ``server_args.disable_radix_cache``), then every
request decodes until it has ``max_new_tokens``. Batches reach the stand-in's ``TpModelWorker`` as
the real scheduler hands them over: ``ScheduleBatch.get_model_worker_batch()`` where the version
has it, else the ScheduleBatch itself; through the overlap thread's ``TpModelWorkerClient`` on
versions that have one. ``run_engine`` starts the scheduler in a spawned process, as
``sglang.srt.entrypoints.engine`` does.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

import torch


class Scheduler:
    def __init__(self, server_args: Any, gpu_id: int = 0, tp_rank: int = 0, chunk_size: int | None = None) -> None:
        from sglang.srt.managers.tp_worker import TpModelWorker

        self.server_args = server_args
        self.chunk_size = chunk_size
        self.overlap = None
        if not server_args.disable_overlap_schedule:
            try:
                from sglang.srt.managers.tp_worker_overlap_thread import TpModelWorkerClient
            except ImportError:  # 0.5.4+: overlap scheduling runs the forward in the scheduler thread
                pass
            else:
                self.overlap = TpModelWorkerClient(server_args, gpu_id=gpu_id, tp_rank=tp_rank)
        self.worker = (
            self.overlap.worker if self.overlap else TpModelWorker(server_args, gpu_id=gpu_id, tp_rank=tp_rank)
        )
        self.model_runner = self.worker.model_runner
        self.cached_prompts: list[list[int]] = []  # the toy radix cache

    def _cached_prefix(self, prompt: list[int]) -> int:
        if self.server_args.disable_radix_cache:
            return 0
        best = 0
        for cached in self.cached_prompts:
            n = 0
            while n < min(len(cached), len(prompt) - 1) and cached[n] == prompt[n]:
                n += 1
            best = max(best, n)
        return best

    def _run(self, mode: Any, rows: list[tuple[Any, int, int]]) -> list[int]:
        """One forward over rows of (req, cached prefix length, new tokens); the sampled token per row."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        tokens: list[int] = []
        for req, prefix, n in rows:
            tokens += (list(req.origin_input_ids) + req.output_ids)[prefix : prefix + n]
        extend = mode != ForwardMode.DECODE
        batch = ScheduleBatch(
            reqs=[req for req, _, _ in rows],
            forward_mode=mode,
            input_ids=torch.tensor(tokens, dtype=torch.int64),
            seq_lens=torch.tensor([p + n for _, p, n in rows], dtype=torch.int64),
            prefix_lens=[p for _, p, _ in rows] if extend else None,
            extend_lens=[n for _, _, n in rows] if extend else None,
        )
        work = batch.get_model_worker_batch() if hasattr(batch, "get_model_worker_batch") else batch
        with torch.no_grad():
            if self.overlap:
                self.overlap.forward_batch_generation(work)
                batch.reqs = []  # the scheduler moves on to the next batch while the forward thread runs
                return self.overlap.resolve_last_batch_result()
            result = self.worker.forward_batch_generation(work)
            return result[1] if isinstance(result, tuple) else result.next_token_ids  # a tuple before 0.5.4

    def generate(self, waves: list[dict[str, list[int]]], max_new_tokens: int = 3) -> dict[str, list[int]]:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        running: list[Any] = []
        for wave in waves:
            new = [Req(rid, list(prompt)) for rid, prompt in wave.items()]
            done = {req.rid: self._cached_prefix(req.origin_input_ids) for req in new}
            while any(done[req.rid] < len(req.origin_input_ids) for req in new):
                rows = []
                for req in new:
                    left = len(req.origin_input_ids) - done[req.rid]
                    if left:
                        rows.append((req, done[req.rid], min(left, self.chunk_size or left)))
                decoding = [
                    (req, len(req.origin_input_ids) + len(req.output_ids) - 1, 1)
                    for req in running
                    if self.server_args.enable_mixed_chunk and len(req.output_ids) < max_new_tokens
                ]
                sampled = self._run(ForwardMode.MIXED if decoding else ForwardMode.EXTEND, rows + decoding)
                for (req, prefix, n), token in zip(rows + decoding, sampled, strict=True):
                    if req in new:
                        done[req.rid] = prefix + n
                        if done[req.rid] == len(req.origin_input_ids):
                            req.output_ids.append(int(token))
                    else:
                        req.output_ids.append(int(token))
            self.cached_prompts += [list(req.origin_input_ids) for req in new]
            running += new
        while True:
            active = [req for req in running if len(req.output_ids) < max_new_tokens]
            if not active:
                break
            rows = [(req, len(req.origin_input_ids) + len(req.output_ids) - 1, 1) for req in active]
            for req, token in zip(active, self._run(ForwardMode.DECODE, rows), strict=True):
                req.output_ids.append(int(token))
        return {req.rid: req.output_ids for req in running}


def scheduler_process(server_args: Any, gpu_id: int, waves: list, max_new_tokens: int, conn: Any) -> None:
    """The spawned scheduler process: build the worker, serve the requests, send the outputs back."""
    import os

    import msprobe_hooks

    outputs = Scheduler(server_args, gpu_id=gpu_id).generate(waves, max_new_tokens)
    conn.send({"pid": os.getpid(), "active": msprobe_hooks.current_config() is not None, "outputs": outputs})
    conn.close()


def run_engine(server_args: Any, waves: list, max_new_tokens: int = 3, gpu_id: int = 0) -> dict:
    """What sglang.srt.entrypoints.engine does: spawn the scheduler process and wait for its answer."""
    multiprocessing.set_start_method("spawn", force=True)
    parent, child = multiprocessing.Pipe(duplex=False)
    process = multiprocessing.Process(
        target=scheduler_process, args=(server_args, gpu_id, waves, max_new_tokens, child)
    )
    process.start()
    child.close()
    answer = parent.recv()
    process.join(60)
    return answer
