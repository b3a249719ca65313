"""The reward of the CPU kit's ``main_ppo`` runs (``reward.custom_reward_function.path``): verl loads this file.

verl's default (gsm8k) scores the tiny model's random text 0: every return and advantage is 0 and the
update moves nothing. This one is positive and varies with the response (its share of distinct characters).
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return 1.0 + len(set(solution_str)) / max(1, len(solution_str))
