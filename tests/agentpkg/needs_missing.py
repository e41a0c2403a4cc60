"""Imports a package that is not installed: the error names it (not this module)."""

import turnlog_no_such_dependency  # noqa: F401
