"""The persistent batch (shape of vllm/v1/worker/gpu_input_batch.py).

Row i holds request ``req_ids[i]``; tokens are packed in row order. New requests fill the lowest
free rows first and ``condense()`` moves the last rows into holes, so the row order is generally
not the scheduler's order.
"""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class CachedRequestState:
    req_id: str
    prompt_token_ids: list[int] | None
    sampling_params: object | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids or ())


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int) -> None:
        self.max_num_reqs = max_num_reqs
        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int32)
        self.num_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(max_num_reqs, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int32)

    @property
    def req_ids(self) -> list[str]:
        return list(self._req_ids)  # type: ignore[arg-type]  (no holes once condensed)

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, request: CachedRequestState) -> int:
        free = [i for i, r in enumerate(self._req_ids) if r is None]
        index = free[0] if free else len(self._req_ids)
        if index == len(self._req_ids):
            self._req_ids.append(request.req_id)
        else:
            self._req_ids[index] = request.req_id
        self.req_id_to_index[request.req_id] = index
        tokens = list(request.prompt_token_ids or ()) + request.output_token_ids
        self.token_ids_cpu[index, : len(tokens)] = tokens
        self.num_tokens[index] = len(tokens)
        self.num_prompt_tokens[index] = request.num_prompt_tokens
        self.num_computed_tokens_cpu[index] = request.num_computed_tokens
        return index

    def remove_request(self, req_id: str) -> int | None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._req_ids[index] = None
        return index

    def swap_states(self, i: int, j: int) -> None:
        self._req_ids[i], self._req_ids[j] = self._req_ids[j], self._req_ids[i]
        for name in ("token_ids_cpu", "num_tokens", "num_prompt_tokens", "num_computed_tokens_cpu"):
            array = getattr(self, name)
            array[[i, j]] = array[[j, i]]
        for k in (i, j):
            if self._req_ids[k] is not None:
                self.req_id_to_index[self._req_ids[k]] = k  # type: ignore[index]

    def condense(self) -> None:
        """Fill holes with the last rows, as vLLM does, then drop the empty tail."""
        while None in self._req_ids:
            hole = self._req_ids.index(None)
            last = len(self._req_ids) - 1
            if hole != last and self._req_ids[last] is not None:
                self.swap_states(hole, last)
            self._req_ids.pop()

    def append_token(self, index: int, token: int) -> None:
        self.token_ids_cpu[index, self.num_tokens[index]] = token
        self.num_tokens[index] += 1
