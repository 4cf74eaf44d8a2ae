"""Command line: ``grpokit train [RECIPE.yaml] [key=value ...]``, ``grpokit eval``, ``grpokit train-rm``,
``grpokit plan [RECIPE.yaml] [key=value ...]`` (the memory one device needs, before a run).

Rooms: ``recipes`` (recipe files and the ``train`` command line), ``train_command`` (what ``grpokit train``
runs), ``eval_command``, ``train_rm_command``, ``plan_command`` (the memory plan).

A recipe is a flat YAML mapping of TrainArgs fields (model, task, dataset, reward_funcs, ...) and GRPOConfig
fields (beta, loss_type, ...); ``base: other-recipe`` starts from another recipe and overrides it.
Overrides come after it as ``key=value`` (YAML-typed values, so
``reward_funcs=[accuracy,think_format]`` and ``epsilon_high=0.28`` both work) or as ``--key value``.
Parsing and ``--help`` (every option with its docstring) are done by ``tyro``. Import paths in options
(``reward_funcs=[my_rewards.correct]``, ``answer_extractor=my_rewards.extract``) find modules of the
working directory, as ``python -m`` would.
"""

from __future__ import annotations

import os
import sys

from grpokit.cli.recipes import find_recipe, load_recipe, parse_train_args, to_flag_arguments

__all__ = ["find_recipe", "load_recipe", "main", "parse_train_args", "to_flag_arguments"]


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if os.getcwd() not in sys.path:  # import paths (reward_funcs=[my_rewards.fn]) find the working
        sys.path.insert(0, os.getcwd())  # directory's modules, as under `python -m`
    command = argv[0] if argv and not argv[0].startswith("-") else None
    from grpokit.data.integrity import InputError

    try:
        return _run(command, argv)
    except InputError as error:  # a bad input, refused in one sentence: no traceback
        raise SystemExit(f"grpokit: {error}") from error
    except KeyboardInterrupt as stop:  # a signal outside a run (a run ends with its own closing line)
        print(f"grpokit: {stop or 'interrupted'}; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `grpokit train --help | head`: the reader left; nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception:  # not a bad input: an error of grpokit's (or of code it ran), with its traceback
        import traceback

        traceback.print_exc()
        print(
            "grpokit: the error above is not one of grpokit's input checks: a bug in grpokit, or in code "
            "it ran for you (a reward function, an environment, a library). If it is grpokit's, please "
            "report it with the command and this traceback.",
            file=sys.stderr,
        )
        return 1


def _run(command: str | None, argv: list[str]) -> int:
    if command in (None, "train"):
        from grpokit.cli.train_command import run_training

        arguments = argv[1:] if command else argv
        run_training(parse_train_args(arguments), command=arguments)
        return 0
    if command == "eval":
        from grpokit.cli.eval_command import eval_main

        return eval_main(argv[1:])
    if command == "train-rm":
        from grpokit.cli.train_rm_command import train_rm_main

        return train_rm_main(argv[1:])
    if command == "plan":
        from grpokit.cli.plan_command import plan_main

        return plan_main(argv[1:])
    if command in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    print(f"grpokit: unknown command {command!r}; use train, eval, train-rm or plan", file=sys.stderr)
    return 2
