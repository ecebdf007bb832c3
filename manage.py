#!/usr/bin/env python
"""Django's command-line utility for the rlplane control plane."""

import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    if sys.argv[1:2] == ["runserver"]:
        # The dev server is for a local browser: serve static files and show tracebacks.
        # Set RLPLANE_DEBUG=0 to try production settings under it.
        os.environ.setdefault("RLPLANE_DEBUG", "1")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
