"""The `kvcore` command line: one subcommand per module in kvcore.commands.

Each command module exposes ``HELP`` (one line), ``add_arguments(parser)`` and
``run(args) -> int``.
"""

import argparse
import importlib
from typing import Optional, Sequence

COMMANDS = {
    "bench": "kvcore.commands.bench",
    "serve": "kvcore.commands.serve",
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="kvcore", description="kvcore: KV-cache compression and tiering")
    sub = parser.add_subparsers(dest="command", required=True)
    modules = {}
    for name, module_name in COMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name != module_name:
                raise
            continue  # command not built into this version
        modules[name] = module
        module.add_arguments(sub.add_parser(name, help=module.HELP, description=module.HELP))
    args = parser.parse_args(argv)
    return modules[args.command].run(args)
