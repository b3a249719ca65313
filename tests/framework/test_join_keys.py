"""The prompt hash both sides compute: its definition (version 2), and the training side's tensor form."""

from __future__ import annotations

import hashlib

import pytest
import torch

from msprobe_hooks.join_keys import prompt_hash, tensor_prompt_hash

IDS = [151_935, 0, 7, 2**31 + 5, 42, 9, 77, 23]  # a vocabulary's last id, zero, one above int32


def defined(ids: list[int]) -> str:
    """Version 2 as documented: 16 hex digits of SHA-1 over the ids as little-endian int64."""
    return hashlib.sha1(b"".join(i.to_bytes(8, "little", signed=True) for i in ids)).hexdigest()[:16]


@pytest.mark.parametrize("given", [list, tuple, iter, lambda ids: (i for i in ids)])
def test_prompt_hash_is_sha1_over_little_endian_int64(given):
    assert prompt_hash(given(IDS)) == defined(IDS)


def test_prompt_hash_of_a_range_and_of_nothing():
    assert prompt_hash(range(3, 9)) == defined(list(range(3, 9)))
    assert prompt_hash([]) == hashlib.sha1(b"").hexdigest()[:16]


def test_prompt_hash_tells_prompts_apart():
    assert prompt_hash([1, 2]) != prompt_hash([2, 1])
    assert prompt_hash([1]) != prompt_hash([1, 0])  # a trailing zero id is a token, not padding of the bytes


def test_tensor_prompt_hash_is_the_prompt_hash_of_its_ids():
    sequence = torch.tensor([*IDS, 3, 4, 5])  # a sample's prompt and response, cut to its prompt
    prompt = sequence[: len(IDS)]
    assert tensor_prompt_hash(prompt) == prompt_hash(IDS) == prompt_hash(prompt.tolist())


@pytest.mark.parametrize(
    "make",
    [
        lambda ids: torch.tensor([9, 9, *ids])[2:],  # a slice not at its storage's start (a packed batch's sample)
        lambda ids: torch.tensor([x for i in ids for x in (i, -1)])[::2],  # not contiguous
        lambda ids: torch.tensor([[*ids]]),  # [1, T]
        lambda ids: torch.nested.nested_tensor([torch.tensor(ids), torch.tensor([1, 2])], layout=torch.jagged).values()[
            : len(ids)
        ],  # describe_samples' slice of a jagged input_ids
    ],
)
def test_tensor_prompt_hash_whatever_the_tensor_layout(make):
    tensor = make(IDS)
    assert tensor.dtype == torch.int64
    assert tensor_prompt_hash(tensor) == prompt_hash(IDS)


def test_tensor_prompt_hash_of_int32_ids():
    small = [i for i in IDS if i < 2**31]
    assert tensor_prompt_hash(torch.tensor(small, dtype=torch.int32)) == prompt_hash(small)
