"""The operator's commands behind ``enginegate``: ``config`` (check, show, schema) and ``route explain``.

Each module registers its own subcommands on the ``enginegate`` parser, so ``gateway/cli.py`` stays
the composition of commands and not their code.
"""
