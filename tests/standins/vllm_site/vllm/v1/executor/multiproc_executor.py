"""One worker process per rank, started with vLLM's multiprocessing context (spawn or fork)."""

import os
import tempfile

from vllm.utils import resolve_obj_by_qualname
from vllm.utils.system_utils import get_mp_context


class WorkerProc:
    @staticmethod
    def worker_main(vllm_config, rank: int, init_method: str, conn) -> None:
        worker = resolve_obj_by_qualname(vllm_config.parallel_config.worker_cls)(
            vllm_config, local_rank=rank, rank=rank, distributed_init_method=init_method
        )
        worker.init_device()
        worker.load_model()
        conn.send(("ready", os.getpid()))
        while True:
            message = conn.recv()
            if message is None:
                break
            method, args = message
            conn.send(getattr(worker, method)(*args))


class MultiprocExecutor:
    def __init__(self, vllm_config) -> None:
        context = get_mp_context()
        world_size = vllm_config.parallel_config.world_size
        handle, path = tempfile.mkstemp(prefix="standin-dist-")
        os.close(handle)
        os.unlink(path)  # gloo's file store creates it
        self.connections, self.processes, self.worker_pids = [], [], []
        for rank in range(world_size):
            parent, child = context.Pipe()
            process = context.Process(
                target=WorkerProc.worker_main, args=(vllm_config, rank, f"file://{path}", child), daemon=True
            )
            process.start()
            child.close()
            self.connections.append(parent)
            self.processes.append(process)
        for conn in self.connections:
            ready, pid = conn.recv()
            self.worker_pids.append(pid)

    def collective_rpc(self, method: str, *args):
        for conn in self.connections:
            conn.send((method, args))
        return [conn.recv() for conn in self.connections]

    def execute_model(self, scheduler_output):
        return self.collective_rpc("execute_model", scheduler_output)[0]

    def sample_tokens(self, grammar_output):
        return self.collective_rpc("sample_tokens", grammar_output)[0]

    def shutdown(self) -> None:
        for conn in self.connections:
            conn.send(None)
        for process in self.processes:
            process.join(60)
