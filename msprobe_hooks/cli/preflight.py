"""``msprobe-hooks preflight CONFIG | -- LAUNCH COMMAND``: the command around :mod:`msprobe_hooks.preflight`."""

from __future__ import annotations

import argparse
import os
import sys

DESCRIPTION = """\
Check a verl config file, or a launch command (composed as verl would, not run), for every setting
that would make the training and inference dumps unpairable, and print each finding with the override
that fixes it. A launch command's leading VAR=value words count as its environment. Needs verl's config
stack (omegaconf, hydra-core). Exit status: 0 no findings, 1 findings, 2 the config cannot be read.
See docs/preflight.md."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from msprobe_hooks.preflight.vocabulary import ROLLOUT_BACKENDS

    parser.add_argument(
        "--rollout-backend",
        choices=ROLLOUT_BACKENDS,
        help="the inference engine (default: rollout.name, and vllm-ascend when trainer.device=npu or it is "
        "installed here)",
    )
    parser.add_argument(
        "source", nargs=argparse.REMAINDER, help="CONFIG.yaml, or -- python3 -m verl.trainer.main_ppo ..."
    )


def run(args: argparse.Namespace) -> int:
    from msprobe_hooks import config as config_module

    words = args.source[1:] if args.source[:1] == ["--"] else args.source
    if not words:
        print("msprobe-hooks preflight: error: give a verl config file, or -- and a launch command")
        return 2
    try:  # verl's config stack, which verl brings along; the commands that need only the rule names run without it
        import hydra  # noqa: F401  (composing a primary config or a launch command)

        from msprobe_hooks.preflight.verl_config import ConfigSourceError, from_command, from_file
    except ModuleNotFoundError as exc:
        print(
            f"msprobe-hooks preflight: error: reading a verl config needs verl's config stack (omegaconf, "
            f"hydra-core), which {sys.executable} cannot import ({exc}); run preflight where verl is installed"
        )
        return 2
    from msprobe_hooks.preflight.findings import check, report, rollout_backend

    environ = dict(os.environ)
    try:
        if len(words) == 1 and not words[0].split()[1:]:  # one word: a file; one quoted string: a command
            label, config = words[0], from_file(words[0])
        else:
            label = "launch command"
            config, assignments = from_command(words)
            environ.update(assignments)
    except ConfigSourceError as exc:
        print(f"msprobe-hooks preflight: error: {exc}")
        return 2
    settings = config_module.load(environ)
    if args.rollout_backend is None:
        guessed = rollout_backend(config)
        print(
            f"# rollout backend: {guessed} (from the config and this machine; --rollout-backend sets it)",
            file=sys.stderr,
        )
    findings = check(config, settings, environ, args.rollout_backend)
    for line in report(findings, label):
        print(line)
    return 1 if findings else 0
