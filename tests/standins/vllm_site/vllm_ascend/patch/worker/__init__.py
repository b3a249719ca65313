import vllm_ascend.patch.worker.patch_model_runner  # noqa: F401
