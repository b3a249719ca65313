"""Reading ``msprobe-hooks doctor``'s output: its patch table and its spawn checks."""

from __future__ import annotations


def doctor_patches(stdout: str) -> dict[str, str]:
    """``msprobe-hooks doctor``'s patch table: patch name -> what it says of that patch."""
    rows = [line.split() for line in stdout.splitlines()]
    return {words[0]: " ".join(words[1:]) for words in rows if words and "." in words[0]}


# What ``doctor --spawn-check`` says in an inference venv: every kind of child activates; no Ray there.
SPAWN_CHECKS_WITHOUT_RAY = [["spawn", "active"], ["fork", "active"], ["subprocess", "active"], ["ray", "task"]]


def spawn_checks(stdout: str) -> list[list[str]]:
    """The first two words of each line of ``doctor --spawn-check``'s spawn-check section."""
    return [line.split()[:2] for line in stdout.split("spawn check")[1].splitlines()[1:]]
