"""Stand-in for sglang/srt/managers/tp_worker_overlap_thread.py (0.5.2-0.5.3): forwards run in their own thread."""

import queue
import threading

import torch

from sglang.srt.managers.tp_worker import TpModelWorker


class TpModelWorkerClient:
    """A tensor parallel model worker that runs the forward in a separate thread."""

    def __init__(self, server_args, gpu_id: int, tp_rank: int):
        self.worker = TpModelWorker(server_args, gpu_id, tp_rank)
        self.input_queue = queue.Queue()
        self.output_queue = queue.Queue()
        self.forward_thread = threading.Thread(target=self.forward_thread_func, daemon=True)
        self.forward_thread.start()

    def forward_thread_func(self):
        with torch.no_grad():
            while True:
                model_worker_batch = self.input_queue.get()
                if not model_worker_batch:
                    break
                _, next_token_ids, _ = self.worker.forward_batch_generation(model_worker_batch)
                self.output_queue.put(next_token_ids)

    def resolve_last_batch_result(self, launch_done=None):
        return self.output_queue.get()

    def forward_batch_generation(self, model_worker_batch):
        self.input_queue.put(model_worker_batch)
        return None, None, False
