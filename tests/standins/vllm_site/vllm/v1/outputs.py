from dataclasses import dataclass, field


@dataclass
class ModelRunnerOutput:
    req_ids: list[str] = field(default_factory=list)
    # one list per request in req_ids order: the sampled token, or [] for a partial prefill chunk
    sampled_token_ids: list[list[int]] = field(default_factory=list)


EMPTY_MODEL_RUNNER_OUTPUT = ModelRunnerOutput()
