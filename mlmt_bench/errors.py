"""Errors that the CLI reports as one line and exit code 2 (no traceback unless --debug)."""


class UserError(Exception):
    """Bad input from the user: a malformed spec, an unknown component, a corrupt data file.

    The message is complete on its own (it names the file / field / value at fault).
    """
