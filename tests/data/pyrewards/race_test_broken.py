"""A module that fails to import (it needs a package that is not installed): the tests
check the error names the missing package, not this module."""

import race_test_not_installed_anywhere  # noqa: F401
